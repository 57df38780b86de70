use super::*;
use crate::plan::{HashField, KernelPlan, SlotTable};

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), port)
}

/// Ports of every shape a table has columns for.
fn ports_v4() -> Vec<ServicePort> {
    let mut a = ServicePort::new("shop", "web", "http", Protocol::Tcp, 80);
    a.cluster_ip = Some("10.96.0.10".parse().unwrap());
    a.node_port = 30080;
    a.external_ips = vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
    a.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
    a.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap(), "0.0.0.0/0".parse().unwrap()];
    a.external_traffic_policy = TrafficPolicy::Local;
    a.health_check_node_port = 31000;
    a.affinity_timeout_seconds = 10800;
    let mut terminating = ep("10.244.2.9", 8080);
    terminating.conditions = Conditions { ready: false, serving: true, terminating: true, is_local: true };
    terminating.zone = Some("zone-b".into());
    let mut weighted = ep("10.244.1.5", 8080);
    weighted.weight = 7;
    weighted.zone = Some("zone-ä".into());
    a = a.with_cluster_endpoints(vec![weighted, terminating, ep("10.244.3.1", 8443)]);
    a.cluster_endpoints = vec![0, 2];
    a.local_endpoints = vec![1];
    a.cluster_plan = Some(Plan::Weighted(vec![1, 3]));
    a.local_plan =
        Some(Plan::Slots(SlotTable { field: HashField::Source, seed: 5, rows: 1, cols: 2, slots: vec![0, 0] }));
    // Same Service, another port: namespace and name shared.
    let mut b = ServicePort::new("shop", "web", "https", Protocol::Udp, 443);
    b.cluster_ip = Some("10.96.0.10".parse().unwrap());
    b = b.with_cluster_endpoints(vec![ep("10.244.1.5", 8443)]);
    b.cluster_plan = Some(Plan::Kernel(KernelPlan { scheduler: "wrr".into(), weights: vec![2], flags: 1 }));
    // Headless-like: no cluster IP, no endpoints, no port name, SCTP.
    let c = ServicePort::new("other", "db", "", Protocol::Sctp, 5432);
    vec![a, b, c]
}

fn ports_v6() -> Vec<ServicePort> {
    let mut a = ServicePort::new("ns", "v6", "dns", Protocol::Udp, 53);
    a.cluster_ip = Some("fd00:96::a".parse().unwrap());
    a.external_ips = vec!["2001:db8::1".parse().unwrap()];
    a.load_balancer_source_ranges = vec!["2001:db8::/32".parse().unwrap()];
    a.internal_traffic_policy = TrafficPolicy::Local;
    a = a.with_cluster_endpoints(vec![ep("fd00:244::1", 53), ep("fd00:244::ffff:1", 5353)]);
    a.local_endpoints = vec![1, 0];
    vec![a]
}

#[test]
fn a_table_decodes_to_the_ports_it_was_encoded_from() {
    for (family, ports) in [(IpFamily::V4, ports_v4()), (IpFamily::V6, ports_v6()), (IpFamily::V4, vec![])] {
        let table = encode(family, &ports).unwrap();
        assert_eq!(table.len(), ports.len());
        assert_eq!(decode(&table).unwrap(), ports, "{family:?}");
    }
}

#[test]
fn neighbours_share_their_namespace_and_name_and_a_zone_is_written_once() {
    let mut ports = ports_v4();
    ports[1].endpoints[0].zone = Some("zone-b".into());
    let table = encode(IpFamily::V4, &ports).unwrap();
    // shop, web, http, the zones of web:http's endpoints, https, other, db, "".
    assert_eq!(table.namespaces, [0, 0, 6]);
    assert_eq!(table.names, [1, 1, 7]);
    assert_eq!(table.port_names, [2, 5, 8]);
    let zones: Vec<u32> = table.endpoint_zones.iter().copied().filter(|&z| z != 0).collect();
    assert_eq!(zones.len(), 3);
    assert_eq!(zones[1], zones[2], "zone-b written once");
    assert_eq!(decode(&table).unwrap(), ports);
}

#[test]
fn an_address_of_the_other_family_is_not_sent() {
    let e = encode(IpFamily::V6, &ports_v4()).unwrap_err();
    assert_eq!((e.column, e.index), ("cluster-ips", 0), "{e}");
    let mut ports = ports_v6();
    ports[0].endpoints[1].ip = "10.0.0.1".parse().unwrap();
    let e = encode(IpFamily::V6, &ports).unwrap_err();
    assert_eq!((e.column, e.index), ("endpoint-words", 1), "{e}");
}

/// Each malformation, applied to a good table, is refused with its column.
#[test]
fn a_malformed_table_is_refused_with_the_column_named() {
    type Break = fn(&mut PortTable);
    let cases: &[(&str, Break)] = &[
        ("text-ends", |t| t.text_ends[1] = 0),
        ("text-ends", |t| *t.text_ends.last_mut().unwrap() = u32::MAX),
        // Inside "ä" of zone-ä.
        ("text-ends", |t| {
            let at = t.text.find('ä').unwrap() as u32 + 1;
            let k = t.text_ends.iter().position(|&e| e > at).unwrap();
            t.text_ends[k - 1] = at;
        }),
        ("names", |t| t.names[2] = 999),
        ("port-names", |t| {
            t.port_names.pop();
        }),
        ("protocols", |t| t.protocols[0] = 3),
        ("flags", |t| t.flags[1] |= 8),
        ("cluster-ips", |t| t.cluster_ips[2] = 1),
        ("cluster-ips", |t| {
            t.cluster_ips.pop();
        }),
        ("external-ip-ends", |t| t.external_ip_ends[0] = 3),
        ("external-ip-ends", |t| t.external_ip_ends = vec![2, 1, 2]),
        ("load-balancer-ip-ends", |t| t.load_balancer_ip_ends[2] = 0),
        ("source-range-prefixes", |t| t.source_range_prefixes[0] = 33),
        ("source-range-prefixes", |t| {
            t.source_range_prefixes.pop();
        }),
        ("endpoint-ends", |t| t.endpoint_ends[2] = 5),
        ("endpoint-words", |t| {
            t.endpoint_words.pop();
        }),
        ("endpoint-conditions", |t| t.endpoint_conditions[0] = 16),
        ("endpoint-zones", |t| t.endpoint_zones[0] = 999),
        ("endpoint-weights", |t| {
            t.endpoint_weights.push(1);
        }),
        // Port web:https's one cluster endpoint, entry 2 of the column.
        ("cluster-endpoints", |t| t.cluster_endpoints[2] = 1),
        ("local-endpoint-ends", |t| t.local_endpoint_ends[2] = 0),
        ("local-endpoints", |t| t.local_endpoint_ends[0] = 0),
        ("cluster-plans", |t| t.cluster_plans.swap(0, 1)),
        ("local-plans", |t| t.local_plans[0].0 = 3),
    ];
    let good = encode(IpFamily::V4, &ports_v4()).unwrap();
    for (column, break_it) in cases {
        let mut t = good.clone();
        break_it(&mut t);
        let e = decode(&t).expect_err(column);
        assert_eq!(e.column, *column, "{e}");
        assert!(e.to_string().starts_with(&format!("port-table {column}[")), "{e}");
    }
    // The index is the column's, not the port's own list's.
    let mut t = good.clone();
    t.cluster_endpoints[2] = 1;
    assert_eq!(decode(&t).unwrap_err().index, 2);
    // One long string named by every port would decode to far more than
    // the table: a string is at most MAX_STRING bytes.
    let mut t = good.clone();
    let long = "x".repeat(MAX_STRING + 1);
    t.text = format!("{long}{}", t.text);
    for end in &mut t.text_ends {
        *end += long.len() as u32;
    }
    t.text_ends.insert(0, long.len() as u32);
    for column in [&mut t.namespaces, &mut t.names, &mut t.port_names] {
        column.iter_mut().for_each(|i| *i = 0);
    }
    let e = decode(&t).unwrap_err();
    assert_eq!((e.column, e.index), ("text-ends", 0), "{e}");
    let mut ports = ports_v4();
    ports[1].name = long;
    let e = encode(IpFamily::V4, &ports).unwrap_err();
    assert!(e.why.starts_with("shop/web:https: a string of 1025 bytes"), "{e}");
    // IPv6: a /129 and a torn address.
    let good = encode(IpFamily::V6, &ports_v6()).unwrap();
    let mut t = good.clone();
    t.source_range_prefixes[0] = 129;
    assert_eq!(decode(&t).unwrap_err().column, "source-range-prefixes");
    let mut t = good;
    t.external_ips.pop();
    assert_eq!(decode(&t).unwrap_err().column, "external-ips");
}

/// A small deterministic generator (no dependency for one test).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Any single value of any column changed, or any column cut short:
/// decoding answers (a port list or an error), never panics.
#[test]
fn random_damage_never_panics_the_decoder() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (family, ports) in [(IpFamily::V4, ports_v4()), (IpFamily::V6, ports_v6())] {
        let good = encode(family, &ports).unwrap();
        for _ in 0..20_000 {
            let mut t = good.clone();
            let value = match rng.next() % 4 {
                0 => 0,
                1 => u32::MAX,
                2 => (rng.next() % 64) as u32,
                _ => rng.next() as u32,
            };
            let cut = rng.next().is_multiple_of(5);
            let u32s: [&mut Vec<u32>; 19] = [
                &mut t.text_ends,
                &mut t.namespaces,
                &mut t.names,
                &mut t.port_names,
                &mut t.affinity_seconds,
                &mut t.cluster_ips,
                &mut t.external_ip_ends,
                &mut t.external_ips,
                &mut t.load_balancer_ip_ends,
                &mut t.load_balancer_ips,
                &mut t.source_range_ends,
                &mut t.source_range_words,
                &mut t.endpoint_ends,
                &mut t.endpoint_words,
                &mut t.endpoint_zones,
                &mut t.cluster_endpoint_ends,
                &mut t.cluster_endpoints,
                &mut t.local_endpoint_ends,
                &mut t.local_endpoints,
            ];
            let pick = (rng.next() % 23) as usize;
            if let Some(column) = u32s.into_iter().nth(pick) {
                if cut {
                    column.pop();
                } else if !column.is_empty() {
                    let i = (rng.next() % column.len() as u64) as usize;
                    column[i] = value;
                }
            } else {
                let bytes: [&mut Vec<u8>; 4] =
                    [&mut t.protocols, &mut t.flags, &mut t.source_range_prefixes, &mut t.endpoint_conditions];
                let column = bytes.into_iter().nth(pick - 19).expect("23 columns");
                if cut {
                    column.pop();
                } else if !column.is_empty() {
                    let i = (rng.next() % column.len() as u64) as usize;
                    column[i] = value as u8;
                }
            }
            // The text cut short, a plan moved to any port, a u16 column
            // (the endpoints' ports set how many endpoints there are) cut
            // short or changed.
            let u16s: [&mut Vec<u16>; 5] = [
                &mut t.ports,
                &mut t.node_ports,
                &mut t.health_check_node_ports,
                &mut t.endpoint_ports,
                &mut t.endpoint_weights,
            ];
            if let Some(column) = u16s.into_iter().nth((rng.next() % 10) as usize) {
                if cut {
                    column.pop();
                } else if !column.is_empty() {
                    let i = (rng.next() % column.len() as u64) as usize;
                    column[i] = value as u16;
                }
            }
            match rng.next() % 8 {
                0 => t.text.truncate(t.text.floor_char_boundary((rng.next() % 64) as usize)),
                1 => {
                    if let Some(plan) = t.cluster_plans.first_mut() {
                        plan.0 = value;
                    }
                }
                2 => {
                    if let Some(plan) = t.local_plans.last_mut() {
                        plan.0 = value;
                    }
                }
                _ => {}
            }
            let _ = decode(&t);
        }
    }
}
