use super::*;
use crate::source::manifests::parse_documents;

fn state_from(yaml: &str) -> State {
    let (objects, errors) = parse_documents(yaml);
    assert!(errors.is_empty(), "{errors:?}");
    let mut state = State::new("node-a");
    for o in objects {
        state.apply(Event::Apply(o));
    }
    state.apply(Event::Synced);
    state
}

fn name(ns: &str, n: &str) -> ServiceName {
    ServiceName { namespace: ns.into(), name: n.into() }
}

const YAML: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIPs: [10.96.0.10, "fd00::10"]
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: a, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.9]}
- {addresses: [10.1.0.2], nodeName: node-b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: b, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.2], nodeName: node-a}
"#;

#[test]
fn merges_slices_dedupes_and_marks_local() {
    let state = state_from(YAML);
    let ports = state.service_ports(IpFamily::V4, &name("shop", "web"));
    assert_eq!(ports.len(), 2);
    let http = &ports[0];
    assert_eq!(http.key, "shop/web:http");
    assert_eq!(http.affinity_timeout_seconds, 10800, "ClientIP default timeout");
    let eps: Vec<String> = http.endpoints.iter().map(|e| e.host_port()).collect();
    assert_eq!(eps, ["10.1.0.2:8080", "10.1.0.9:8080"], "sorted, de-duplicated");
    assert!(http.endpoints[0].conditions.is_local, "the local copy wins");
    assert_eq!(http.cluster_endpoints, [0, 1]);
    assert!(http.local_endpoints.is_empty(), "no Local policy, no local set");
    assert!(ports[1].endpoints.is_empty(), "no slice port named dns");
    let v6 = state.service_ports(IpFamily::V6, &name("shop", "web"));
    assert_eq!(v6[0].cluster_ip, Some("fd00::10".parse().unwrap()));
    assert!(v6[0].endpoints.is_empty());
}

#[test]
fn an_ipv4_slice_holds_ipv4_endpoints_only() {
    // The API server accepts an IPv4-mapped IPv6 address in an IPv4 slice
    // (the manifest source refuses it); upstream reads it as the IPv4
    // address. Another IPv6 one is skipped.
    use crate::source::slice::{Slice, SliceEndpoint};
    let mut state = state_from(YAML);
    let (objects, _) = parse_documents(YAML);
    let Some(Object::EndpointSlice(a)) = objects.into_iter().find(|o| o.object_ref().name == "a") else { panic!() };
    let mut a = Slice::clone(&a);
    a.endpoints = ["::ffff:10.1.0.7", "fd00::9"]
        .iter()
        .map(|ip| SliceEndpoint::new(false, Some(ip.parse().unwrap()), None, None))
        .collect();
    state.apply(Event::Apply(Object::EndpointSlice(std::sync::Arc::new(a))));
    let ports = state.service_ports(IpFamily::V4, &name("shop", "web"));
    let eps: Vec<String> = ports[0].endpoints.iter().map(|e| e.host_port()).collect();
    assert_eq!(eps, ["10.1.0.2:8080", "10.1.0.7:8080"]);
    assert!(state.service_ports(IpFamily::V6, &name("shop", "web"))[0].endpoints.is_empty());
}

#[test]
fn tracks_changes_and_deletions() {
    let mut state = state_from(YAML);
    let changes = state.take_changes();
    assert_eq!(changes.services.len(), 1);
    assert!(state.take_changes().is_empty());
    let deleted =
        state.apply(Event::Delete(ObjectRef { kind: Kind::EndpointSlice, namespace: "shop".into(), name: "b".into() }));
    assert!(deleted);
    assert!(state.take_changes().services.contains_key(&name("shop", "web")));
    let ports = state.service_ports(IpFamily::V4, &name("shop", "web"));
    assert!(!ports[0].endpoints[0].conditions.is_local);
    assert!(!state.apply(Event::Delete(ObjectRef {
        kind: Kind::EndpointSlice,
        namespace: "shop".into(),
        name: "zzz".into()
    })));
    state.apply(Event::Delete(ObjectRef { kind: Kind::Service, namespace: "shop".into(), name: "web".into() }));
    assert!(state.service_ports(IpFamily::V4, &name("shop", "web")).is_empty());
}

#[test]
fn changes_keep_the_endpoints_before_the_batch_and_the_state_has_the_ones_after() {
    let mut state = state_from(YAML);
    let initial = state.take_changes();
    assert!(initial.services[&name("shop", "web")].previous.is_empty(), "nothing was programmed before the list");
    assert_eq!(state.endpoints_map(&name("shop", "web"))["shop/web:http"].1.len(), 2, "its first endpoints");
    let ep = |ip: &str| (ip.parse::<std::net::IpAddr>().unwrap(), 8080u16);
    state.apply(Event::Delete(ObjectRef { kind: Kind::EndpointSlice, namespace: "shop".into(), name: "a".into() }));
    // A second change in the same batch keeps the first `previous`.
    state.apply(Event::Delete(ObjectRef { kind: Kind::EndpointSlice, namespace: "shop".into(), name: "b".into() }));
    let changes = state.take_changes();
    let web = &changes.services[&name("shop", "web")];
    let http = &web.previous["shop/web:http"];
    assert_eq!(http.0, Protocol::Tcp);
    assert_eq!(http.1, [ep("10.1.0.2"), ep("10.1.0.9")].into_iter().collect());
    assert!(state.endpoints_map(&name("shop", "web"))["shop/web:http"].1.is_empty());
    assert_eq!(web.previous["shop/web:dns"].0, Protocol::Udp);
    // Merging a later batch keeps the earliest previous.
    let mut merged = changes.clone();
    let mut later = Changes::default();
    later.services.insert(name("shop", "web"), ServiceChange { previous: EndpointsMap::new() });
    let new_previous: EndpointsMap =
        [("shop/new:dns".to_string(), (Protocol::Udp, [ep("10.1.0.7")].into_iter().collect()))].into_iter().collect();
    later.services.insert(name("shop", "new"), ServiceChange { previous: new_previous.clone() });
    merged.merge(later);
    assert_eq!(merged.services[&name("shop", "web")].previous, web.previous);
    assert_eq!(merged.services[&name("shop", "new")].previous, new_previous);
}

#[test]
fn other_nodes_are_ignored() {
    let mut state = State::new("node-a");
    let (objects, _) = parse_documents("apiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n");
    assert!(!state.apply(Event::Apply(objects[0].clone())));
    let (objects, _) = parse_documents(
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}\nspec: {podCIDRs: [10.244.1.0/24]}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.2}, {type: InternalIP, address: 'fd00::2'}]}\n",
    );
    assert!(state.apply(Event::Apply(objects[0].clone())));
    let node = state.node(IpFamily::V4);
    assert_eq!(node.addresses, ["192.168.0.2".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(node.zone, "z1");
    assert_eq!(node.pod_cidrs.len(), 1);
}

/// A pod network may give a new pod the address of a pod that is still
/// terminating (kubernetes/kubernetes#135266): the endpoint that is not
/// terminating is the one programmed, in whichever order the two come and
/// whichever node each runs on (upstream's `endpointslicecache.go` since
/// kubernetes/kubernetes#135593).
#[test]
fn a_reused_address_goes_to_the_endpoint_that_is_not_terminating() {
    let slice = |name: &str, endpoints: &str| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns1, labels: {{kubernetes.io/service-name: svc1}}}}\naddressType: IPv4\nports: [{{name: p80, port: 80}}]\nendpoints: {endpoints}\n"
        )
    };
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: svc1, namespace: ns1}\nspec: {clusterIP: 172.30.0.41, ports: [{name: p80, port: 80}]}\n";
    let ghost =
        "{addresses: [10.180.0.1], nodeName: node-a, conditions: {ready: false, serving: false, terminating: true}}";
    let fresh = "{addresses: [10.180.0.1], nodeName: node-b, conditions: {ready: true}}";
    for (what, slices) in [
        ("ghost first, one slice", slice("a", &format!("[{ghost}, {fresh}]"))),
        ("ghost last, one slice", slice("a", &format!("[{fresh}, {ghost}]"))),
        ("ghost in the first slice", slice("a", &format!("[{ghost}]")) + &slice("b", &format!("[{fresh}]"))),
        ("ghost in the last slice", slice("a", &format!("[{fresh}]")) + &slice("b", &format!("[{ghost}]"))),
    ] {
        let state = state_from(&format!("{service}{slices}"));
        let ports = state.service_ports(IpFamily::V4, &name("ns1", "svc1"));
        let eps = &ports[0].endpoints;
        assert_eq!(eps.len(), 1, "{what}: one endpoint per address:port");
        let c = &eps[0].conditions;
        assert!(c.ready && !c.terminating && !c.is_local, "{what}: the running pod on node-b wins, got {c:?}");
        assert_eq!(ports[0].cluster_endpoints, [0], "{what}: the Service has a ready endpoint");
    }
    // Two terminating copies: the first stays (upstream's order rule).
    let draining = |node: &str, serving: bool| {
        format!(
            "{{addresses: [10.180.0.1], nodeName: {node}, conditions: {{ready: false, serving: {serving}, terminating: true}}}}"
        )
    };
    let state = state_from(&format!(
        "{service}{}",
        slice("a", &format!("[{}, {}]", draining("node-b", true), draining("node-a", false)))
    ));
    let ports = state.service_ports(IpFamily::V4, &name("ns1", "svc1"));
    assert!(ports[0].endpoints[0].conditions.serving, "of two terminating copies the first stays");
}

use crate::source::service::{ServiceMeta, ServicePort as K8sPort, ServiceSpec};
use crate::source::slice::{SliceEndpoint, SliceMeta};
use crate::source::{Service, Slice};
use k8s_openapi::api::discovery::v1::EndpointPort;

/// A Service `ns/wide` of `n` ports (p0, p1, …) with `annotations`.
fn wide_service(n: usize, annotations: &[(&str, &str)]) -> Arc<Service> {
    let ports =
        (0..n).map(|i| K8sPort { name: Some(format!("p{i}")), protocol: None, port: 1000 + i as i32, node_port: None });
    let annotations: BTreeMap<String, String> =
        annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Arc::new(Service {
        metadata: ServiceMeta {
            name: Some("wide".into()),
            namespace: Some("ns".into()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.1".into()),
            ports: Some(ports.collect()),
            ..Default::default()
        }),
        ingress: Vec::new(),
    })
}

/// Its EndpointSlice: the same `n` ports, one endpoint (10.1.0.1), and
/// `weights` as its `kpx.dev/weights`.
fn wide_slice(n: usize, weights: &str) -> Arc<Slice> {
    let ports =
        (0..n).map(|i| EndpointPort { name: Some(format!("p{i}")), port: Some(8000 + i as i32), ..Default::default() });
    Arc::new(Slice {
        meta: SliceMeta {
            name: "wide-1".into(),
            namespace: "ns".into(),
            service_name: Some("wide".into()),
            annotations: Some(BTreeMap::from([(annotations::WEIGHTS.to_string(), weights.to_string())])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        ports: Some(ports.collect()),
        endpoints: vec![SliceEndpoint::new(false, Some("10.1.0.1".parse().unwrap()), None, None)],
    })
}

/// `n` entries of `kpx.dev/weights`: valid ones (`10.1.x.y=2`, the first
/// for the slice's endpoint) or bad ones (`x<i>=1`, not an address).
fn weights_text(n: usize, valid: bool) -> String {
    let entry =
        |i: usize| if valid { format!("10.1.{}.{}=2", (i + 1) / 256, (i + 1) % 256) } else { format!("x{i}=1") };
    (0..n).map(entry).collect::<Vec<_>>().join(",")
}

/// A Service with n ports whose slice has n weight entries, valid or
/// bad: the annotation is parsed when the slice is stored, and a pass
/// (every port, both families, the endpoints map, the local counts, five
/// times) parses and logs nothing; the n bad entries are one line, once
/// per change of the slice.
#[test]
fn annotations_are_parsed_and_reported_once_per_change_never_per_port_or_pass() {
    let n = 500;
    let wide = name("ns", "wide");
    for valid in [true, false] {
        let mut state = State::new("node-a");
        state.apply(Event::Apply(Object::Service(wide_service(n, &[]))));
        let slice = wide_slice(n, &weights_text(n, valid));
        state.apply(Event::Apply(Object::EndpointSlice(slice.clone())));
        state.apply(Event::Synced);
        let per_change = usize::from(!valid);
        assert_eq!(state.annotation_warnings(), per_change, "valid: {valid}: one line for {n} bad entries");
        let weight = if valid { 2 } else { 1 };
        for _ in 0..5 {
            let ports = state.service_ports(IpFamily::V4, &wide);
            assert_eq!(ports.len(), n);
            let weighted = |p: &model::ServicePort| p.endpoints.len() == 1 && p.endpoints[0].weight == weight;
            assert!(ports.iter().all(weighted), "valid: {valid}");
            assert_eq!(state.endpoints_map(&wide).len(), n);
            state.no_local_endpoints(&wide, IpFamily::V4);
        }
        assert_eq!(state.annotation_warnings(), per_change, "valid: {valid}: no warning at a pass");
        state.apply(Event::Apply(Object::EndpointSlice(slice)));
        assert_eq!(state.annotation_warnings(), 2 * per_change, "valid: {valid}: one more line per change");
    }
}

/// One change of the slice and five passes over its Service (about what
/// a sync makes of one change), in this thread's CPU time.
fn change_and_passes(state: &mut State, slice: &Arc<Slice>) -> std::time::Duration {
    let wide = name("ns", "wide");
    let work = || {
        state.apply(Event::Apply(Object::EndpointSlice(slice.clone())));
        state.take_changes();
        (0..5).map(|_| state.service_ports(IpFamily::V4, &wide).len()).sum::<usize>()
    };
    crate::cpu_time::of(work).1
}

/// The cost of a change and its passes grows with n (ports and weight
/// entries), not n²: each port parsed the annotation (and scanned the
/// slice's ports) at every pass before, 576 ms at 1,000 and 7,660 ms at
/// 4,000.
#[test]
fn a_change_to_a_wide_service_costs_time_linear_in_its_ports_and_weights() {
    for valid in [true, false] {
        let time = |n: usize| {
            let mut state = State::new("node-a");
            state.apply(Event::Apply(Object::Service(wide_service(n, &[]))));
            state.apply(Event::Synced);
            let slice = wide_slice(n, &weights_text(n, valid));
            // The best of five: other tests share the cores.
            (0..5).map(|_| change_and_passes(&mut state, &slice)).min().unwrap_or_default()
        };
        let n = 500;
        let _warm = time(n / 4);
        let (small, large) = (time(n), time(8 * n));
        let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-6);
        eprintln!("valid weights: {valid}: {n} -> {small:?}, {} -> {large:?} (x{ratio:.1})", 8 * n);
        // Linear is x8, quadratic x64: the line between them is x20.
        assert!(ratio < 20.0, "valid: {valid}: 8x the ports took x{ratio:.1} the time ({small:?} -> {large:?})");
    }
}

/// `kpx.dev/scheduler-params` of its bound's size on 2,000 ports: one
/// copy, which every port points to, at every pass (200 KiB on 2,000
/// ports held 874 MB when each port had its own). One byte over the bound
/// is refused by name: the Service's ports stand, on the default
/// scheduler.
#[test]
fn scheduler_parameters_of_the_bound_are_held_once_for_every_port() {
    let n = 2000;
    let params = format!("blob={}", "v".repeat(annotations::MAX_SCHEDULER_PARAMS_BYTES - 5));
    let with =
        |params: &str| wide_service(n, &[(annotations::SCHEDULER, "maglev"), (annotations::SCHEDULER_PARAMS, params)]);
    let mut state = State::new("node-a");
    state.apply(Event::Apply(Object::Service(with(params.as_str()))));
    state.apply(Event::Apply(Object::EndpointSlice(wide_slice(n, ""))));
    assert_eq!(state.annotation_warnings(), 0);
    let wide = name("ns", "wide");
    let ports = state.service_ports(IpFamily::V4, &wide);
    assert_eq!(ports.len(), n);
    let first = ports[0].scheduler.clone().expect("maglev");
    assert_eq!(first.parameters[0].1.len(), annotations::MAX_SCHEDULER_PARAMS_BYTES - 5);
    assert!(ports.iter().all(|p| p.scheduler.as_ref().is_some_and(|s| Arc::ptr_eq(s, &first))), "one copy");
    // The state's, each port's and `first`: nothing else holds one.
    assert_eq!(Arc::strong_count(&first), n + 2);
    let again = state.service_ports(IpFamily::V4, &wide);
    let shared = |p: &model::ServicePort| p.scheduler.as_ref().is_some_and(|s| Arc::ptr_eq(s, &first));
    assert!(again.iter().all(shared), "the next pass too");
    drop((ports, again));

    state.apply(Event::Apply(Object::Service(with(format!("{params}v").as_str()))));
    assert_eq!(state.annotation_warnings(), 1, "refused by name, once");
    let ports = state.service_ports(IpFamily::V4, &wide);
    assert_eq!(ports.len(), n, "the Service's other fields apply");
    assert!(ports.iter().all(|p| p.scheduler.is_none()), "the default scheduler");
    assert_eq!(Arc::strong_count(&first), 1, "the old copy went with the old object");
}

/// A slice's port is found by name and protocol as a scan in the slice's
/// order finds it: the first of two with one name and protocol.
#[test]
fn a_slice_port_is_the_first_of_its_name_and_protocol() {
    let mut state = state_from(YAML);
    let (objects, _) = parse_documents(YAML);
    let Some(Object::EndpointSlice(a)) = objects.into_iter().find(|o| o.object_ref().name == "a") else { panic!() };
    let mut a = Slice::clone(&a);
    let port = |name: &str, protocol: Option<&str>, port: i32| EndpointPort {
        name: Some(name.into()),
        protocol: protocol.map(Into::into),
        port: Some(port),
        ..Default::default()
    };
    a.ports = Some(vec![
        port("http", Some("UDP"), 7070),
        port("zzz", None, 1),
        port("http", None, 8081),
        port("http", Some("TCP"), 8082),
        port("dns", Some("UDP"), 5353),
    ]);
    state.apply(Event::Apply(Object::EndpointSlice(Arc::new(a))));
    let ports = state.service_ports(IpFamily::V4, &name("shop", "web"));
    let http: Vec<String> = ports[0].endpoints.iter().map(|e| e.host_port()).collect();
    assert_eq!(http, ["10.1.0.2:8080", "10.1.0.2:8081", "10.1.0.9:8081"], "b's 8080, a's first TCP http");
    let dns: Vec<String> = ports[1].endpoints.iter().map(|e| e.host_port()).collect();
    assert_eq!(dns, ["10.1.0.2:5353", "10.1.0.9:5353"]);
}
