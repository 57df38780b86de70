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
