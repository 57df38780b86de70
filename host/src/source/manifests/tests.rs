use super::*;
use crate::source::Kind;

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
  - addresses: [10.1.0.5]
ports: [{name: http, port: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
"#;

#[test]
fn parses_services_and_slices_and_skips_other_kinds() {
    let (objects, errors) = parse_documents(GOOD);
    assert!(errors.is_empty(), "{errors:?}");
    let refs: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(refs, ["Service shop/web", "EndpointSlice shop/web-abc"]);
}

#[test]
fn bad_documents_are_named_and_good_ones_kept() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: bad-port}
spec: {clusterIP: 10.96.0.11, ports: [{port: 70000}]}
---
apiVersion: v1
kind: Service
metadata: {name: fine}
spec: {clusterIP: 10.96.0.12, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan}
addressType: IPv4
endpoints: []
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old, namespace: x}
"#;
    let (objects, errors) = parse_documents(text);
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].object_ref().to_string(), "Service default/fine");
    let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(
        messages[0].starts_with("document 1 (Service default/bad-port): spec.ports[0].port: 70000"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("EndpointSlice default/orphan") && messages[1].contains("service-name"),
        "{}",
        messages[1]
    );
    let kinds: Vec<Option<Kind>> = errors.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [Some(Kind::Service), Some(Kind::EndpointSlice), Some(Kind::EndpointSlice)]);
    assert!(messages[2].contains("unsupported apiVersion"), "{}", messages[2]);
}

/// Values a Service's rules are built from are checked as the API server
/// checks them: a source range that cannot be read (which would leave the
/// load balancer open) or an ingress IP that is none refuses the Service,
/// naming the field; leading zeros are read as Kubernetes reads them.
#[test]
fn source_ranges_and_ingress_ips_are_checked() {
    let service = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.13\n  ports: [{{port: 80}}]\n{extra}---\n"
        )
    };
    let text = [
        service("range", "  loadBalancerSourceRanges: [bogus]\n"),
        service("signed", "  loadBalancerSourceRanges: [10.0.0.0/+8]\n"),
        service("ingress", "status: {loadBalancer: {ingress: [{ip: junk}]}}\n"),
        service("hostname", "status: {loadBalancer: {ingress: [{hostname: lb.example}]}}\n"),
        service(
            "zeros",
            "  loadBalancerSourceRanges: [203.0.113.000/025]\nstatus: {loadBalancer: {ingress: [{ip: 1.2.3.004}]}}\n",
        ),
    ]
    .concat();
    let (objects, errors) = parse_documents(&text);
    let kept: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(kept, ["Service default/hostname", "Service default/zeros"]);
    let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(messages[0].contains("spec.loadBalancerSourceRanges[0]: \"bogus\" is not a CIDR"), "{messages:?}");
    assert!(messages[1].contains("spec.loadBalancerSourceRanges[0]: \"10.0.0.0/+8\""), "{messages:?}");
    assert!(messages[2].contains("status.loadBalancer.ingress[0].ip: \"junk\" is not an IP address"), "{messages:?}");
}

/// What the API server's own validation refuses (no API server stands in
/// front of --manifests): ports out of 1..=65535, cluster IPs that are
/// not one per IP family or not `clusterIP` first, and endpoint and
/// external IPs that are unspecified, loopback, link-local or multicast.
/// Each hostile object is refused with its kind, namespace/name and why;
/// the good ones count.
#[test]
fn what_the_api_server_refuses_is_refused_by_name() {
    let service = |name: &str, spec: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{{spec}}}\n---\n")
    };
    let slice = |name: &str, family: &str, ports: &str, address: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: {family}\nports: [{ports}]\nendpoints: [{{addresses: [\"{address}\"]}}]\n---\n"
        )
    };
    let http = "{name: http, port: 8080}";
    // (document, what the refusal must say after the object's name).
    let hostile = [
        (
            service("port-70000", "clusterIP: 10.96.0.21, ports: [{port: 70000}]"),
            "spec.ports[0].port: 70000 is not a valid port number",
        ),
        (
            service("port-0", "clusterIP: 10.96.0.20, ports: [{port: 0}]"),
            "spec.ports[0].port: 0 is not a valid port number",
        ),
        (
            service("node-port", "type: NodePort, clusterIP: 10.96.0.29, ports: [{port: 80, nodePort: 70000}]"),
            "spec.ports[0].nodePort: 70000 is not a valid port number",
        ),
        (
            service("health", "clusterIP: 10.96.0.28, healthCheckNodePort: 70000"),
            "spec.healthCheckNodePort: 70000 is not a valid port number",
        ),
        (
            service("two-v4", "clusterIP: 10.96.0.22, clusterIPs: [10.96.0.22, 10.96.0.122]"),
            "spec.clusterIPs: \"10.96.0.22\" and \"10.96.0.122\" are both IPv4: at most one address per IP family",
        ),
        (
            service("two-v6", "clusterIP: \"fd00::22\", clusterIPs: [\"fd00::22\", \"fd00::122\"]"),
            "are both IPv6: at most one address per IP family",
        ),
        (
            service("three", "clusterIP: 10.96.0.23, clusterIPs: [10.96.0.23, \"fd00::23\", 10.96.0.123]"),
            "spec.clusterIPs: 3 addresses, at most 2 (one per IP family)",
        ),
        (
            service("not-first", "clusterIP: 10.96.0.24, clusterIPs: [10.96.0.124]"),
            "spec.clusterIPs[0]: \"10.96.0.124\" must equal spec.clusterIP \"10.96.0.24\"",
        ),
        (
            service("no-cluster-ip", "clusterIPs: [10.96.0.25]"),
            "spec.clusterIPs: must be empty when spec.clusterIP is not set",
        ),
        (
            service("headless-and", "clusterIP: None, clusterIPs: [None, 10.96.0.27]"),
            "spec.clusterIPs: \"None\" must be the only value",
        ),
        (
            service("ext-any", "clusterIP: 10.96.0.26, externalIPs: [0.0.0.0]"),
            "spec.externalIPs[0]: \"0.0.0.0\" may not be unspecified",
        ),
        (
            service("ext-lo", "clusterIP: 10.96.0.26, externalIPs: [192.0.2.1, 127.0.0.1]"),
            "spec.externalIPs[1]: \"127.0.0.1\" may not be in the loopback range",
        ),
        (
            service("ext-lo6", "clusterIP: 10.96.0.26, externalIPs: [\"::1\"]"),
            "spec.externalIPs[0]: \"::1\" may not be in the loopback range",
        ),
        (
            service("ext-ll", "clusterIP: 10.96.0.26, externalIPs: [\"fe80::1\"]"),
            "spec.externalIPs[0]: \"fe80::1\" may not be in the link-local range",
        ),
        (
            service("ext-mcast", "clusterIP: 10.96.0.26, externalIPs: [224.0.0.251]"),
            "spec.externalIPs[0]: \"224.0.0.251\" may not be multicast",
        ),
        (
            slice("web-lo", "IPv4", http, "127.0.0.1"),
            "endpoints[0].addresses: \"127.0.0.1\" may not be in the loopback range",
        ),
        (
            slice("web-metadata", "IPv4", http, "169.254.169.254"),
            "endpoints[0].addresses: \"169.254.169.254\" may not be in the link-local range",
        ),
        (slice("web-any", "IPv4", http, "0.0.0.0"), "endpoints[0].addresses: \"0.0.0.0\" may not be unspecified"),
        (slice("web-mcast", "IPv4", http, "239.1.1.1"), "endpoints[0].addresses: \"239.1.1.1\" may not be multicast"),
        (
            slice("web-mapped", "IPv4", http, "::ffff:127.0.0.1"),
            "endpoints[0].addresses: \"::ffff:127.0.0.1\" may not be in the loopback range",
        ),
        (slice("web-lo6", "IPv6", http, "::1"), "endpoints[0].addresses: \"::1\" may not be in the loopback range"),
        (
            slice("web-ll6", "IPv6", http, "fe80::5"),
            "endpoints[0].addresses: \"fe80::5\" may not be in the link-local range",
        ),
        (
            slice("web-port-0", "IPv4", "{name: http, port: 0}", "10.1.0.9"),
            "ports[0].port: 0 is not a valid port number",
        ),
        (
            slice("web-port-big", "IPv4", "{name: http, port: 65536}", "10.1.0.9"),
            "ports[0].port: 65536 is not a valid port number",
        ),
    ];
    let good = [
        service("web", "clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]"),
        service("dual", "clusterIP: 10.96.0.30, clusterIPs: [10.96.0.30, \"fd00::30\"], ports: [{port: 80}]"),
        service("headless", "clusterIP: None, clusterIPs: [None], ports: [{port: 80}]"),
        service("external", "clusterIP: 10.96.0.31, externalIPs: [192.0.2.1, \"2001:db8::1\"], ports: [{port: 80}]"),
        slice("web-good", "IPv4", http, "10.1.0.5"),
        slice("web-good6", "IPv6", "{name: http}", "fd00:1::5"),
    ];
    let text: String = hostile.iter().map(|(doc, _)| doc.as_str()).chain(good.iter().map(String::as_str)).collect();
    let (objects, errors) = parse_documents(&text);
    let kept: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(
        kept,
        [
            "Service shop/web",
            "Service shop/dual",
            "Service shop/headless",
            "Service shop/external",
            "EndpointSlice shop/web-good",
            "EndpointSlice shop/web-good6",
        ],
        "{errors:?}"
    );
    assert_eq!(errors.len(), hostile.len(), "{errors:?}");
    for (err, (doc, reason)) in errors.iter().zip(&hostile) {
        let said = err.to_string();
        let name = doc.split("name: ").nth(1).and_then(|n| n.split([',', '}']).next()).unwrap_or_default();
        let kind = if doc.contains("kind: Service") { "Service" } else { "EndpointSlice" };
        assert!(said.contains(&format!("({kind} shop/{name}): ")), "{said:?} should name {kind} shop/{name}");
        assert!(said.contains(reason), "{said:?} should say {reason:?}");
        assert_eq!(err.kind.map(Kind::as_str), Some(kind));
        assert_eq!(err.object_ref.as_ref().map(ToString::to_string), Some(format!("{kind} shop/{name}")));
    }
}

/// The source counts each refusal by kind where it logs it: invalid
/// objects, a document that is not YAML (`unknown`), and an object defined
/// twice.
#[test]
fn refusals_are_counted_by_kind() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop}
spec: {clusterIP: 10.96.0.26, externalIPs: [127.0.0.1], ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-lo, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [127.0.0.1]}]
---
kind: [unclosed
---
apiVersion: v1
kind: Service
metadata: {name: twice, namespace: shop}
spec: {clusterIP: 10.96.0.27, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: twice, namespace: shop}
spec: {clusterIP: 10.96.0.28, ports: [{port: 80}]}
"#;
    std::fs::write(dir.join("a.yaml"), text).unwrap();
    let counted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let refusals = {
        let counted = counted.clone();
        Refusals::new(move |kind| counted.lock().unwrap().push(kind))
    };
    let mut source = ManifestSource::new(&dir).unwrap().counting(refusals);
    let events = source.poll().unwrap();
    let applied: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Apply(o) => Some(o.object_ref().to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(applied, ["Service shop/twice"]);
    let mut kinds = counted.lock().unwrap().clone();
    kinds.sort_unstable();
    assert_eq!(kinds, ["EndpointSlice", "Service", "Service", "unknown"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_document_that_is_not_yaml_leaves_the_others() {
    let text = "--- # first\napiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\nkind: [unclosed\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"b\"}, \"spec\": {\"clusterIP\": \"10.96.0.2\", \"ports\": [{\"port\": 81}]}}\n...\n";
    let (objects, errors) = parse_documents(text);
    let names: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(names, ["Service default/a", "Service default/b"]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].document, 2);
    assert!(errors[0].message.starts_with("not valid YAML"), "{}", errors[0]);
}

#[test]
fn a_large_file_parses_in_order_with_every_document_numbered() {
    // Past the parallel threshold, with bad documents near the start, at
    // a run's edge and at the end: the same objects in the file's order,
    // and each error numbered by its place in the file.
    let n = 3 * parse::PARALLEL_DOCUMENTS + 7;
    let bad = [2, n / 2, n / 2 + 1, n];
    let text: String = (1..=n)
        .map(|i| {
            if bad.contains(&i) {
                format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad-{i}}}\nspec: {{ports: [{{port: 70000}}]}}\n")
            } else {
                format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: s-{i}}}\nspec: {{ports: [{{port: 80}}]}}\n")
            }
        })
        .collect();
    let (objects, errors) = parse_documents(&text);
    let names: Vec<String> = objects.iter().map(|o| o.object_ref().name.clone()).collect();
    let want: Vec<String> = (1..=n).filter(|i| !bad.contains(i)).map(|i| format!("s-{i}")).collect();
    assert_eq!(names, want);
    let numbered: Vec<(usize, String)> =
        errors.iter().map(|e| (e.document, e.object.clone().unwrap_or_default())).collect();
    let want: Vec<(usize, String)> = bad.iter().map(|&i| (i, format!("Service default/bad-{i}"))).collect();
    assert_eq!(numbered, want);
}

#[test]
fn poll_reports_changes_and_deletions() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.yaml");
    std::fs::write(&file, GOOD).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    let first = source.poll().unwrap();
    assert_eq!(first.len(), 2);
    assert!(source.poll().unwrap().is_empty(), "nothing changed");

    let edited = GOOD.replace("10.1.0.5", "10.1.0.6");
    // Same length, so make sure the mtime moves.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&file, &edited).unwrap();
    let filetime = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(filetime).unwrap();
    let events = source.poll().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(matches!(&events[0], Event::Apply(Object::EndpointSlice(_))));

    std::fs::remove_file(&file).unwrap();
    let events = source.poll().unwrap();
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| matches!(e, Event::Delete(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refresh_reads_only_what_inotify_named() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-refresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let (a, b) = (dir.join("a.yaml"), dir.join("sub/b.yaml"));
    std::fs::write(&a, GOOD).unwrap();
    std::fs::write(&b, GOOD.replace("name: web, namespace: shop", "name: other, namespace: shop")).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    assert_eq!(source.poll().unwrap().len(), 3);
    // A change inotify did not name is not seen by refresh (the full poll
    // is the safety net), one it names is.
    std::fs::write(&b, GOOD.replace("name: web, namespace: shop", "name: renamed, namespace: shop")).unwrap();
    assert_eq!(source.refresh(std::slice::from_ref(&a)).unwrap(), Vec::<Event>::new());
    let events = source.refresh(std::slice::from_ref(&b)).unwrap();
    let names: Vec<String> = events
        .iter()
        .map(|e| match e {
            Event::Apply(o) => format!("apply {}", o.object_ref()),
            Event::Delete(r) => format!("delete {r}"),
            Event::Synced => "synced".into(),
        })
        .collect();
    assert_eq!(names, ["delete Service shop/other", "apply Service shop/renamed"]);
    // Temporary files are not manifests; a removed file's objects go.
    std::fs::write(dir.join("a.tmp"), "garbage").unwrap();
    assert_eq!(source.refresh(&[dir.join("a.tmp")]).unwrap(), Vec::<Event>::new());
    // (b.yaml defines the same EndpointSlice, which stays.)
    std::fs::remove_file(&a).unwrap();
    let events = source.refresh(std::slice::from_ref(&a)).unwrap();
    assert!(matches!(&events[..], [Event::Delete(r)] if r.to_string() == "Service shop/web"), "{events:?}");
    // A directory, a hidden entry (ConfigMap `..data`) or a removed
    // directory holding files: only a full poll can tell.
    assert!(source.refresh(&[dir.join("sub")]).is_none());
    assert!(source.refresh(&[dir.join("..data")]).is_none());
    std::fs::remove_dir_all(dir.join("sub")).unwrap();
    assert!(source.refresh(&[dir.join("sub")]).is_none());
    assert_eq!(source.poll().unwrap().len(), 2, "the full poll drops sub/b.yaml's objects");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The watch loop itself, on inotify: writers that pass through an empty
/// or missing file (truncate then write; an editor moving the old file
/// away before writing the new one) are read once they are done, so no
/// object is ever deleted on the way; an editor's swap file is nothing.
#[test]
fn writers_in_progress_are_never_read_half_done() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.yaml");
    let svc = |port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: a, namespace: x}}\nspec: {{clusterIP: 10.96.0.1, ports: [{{port: {port}}}]}}\n"
        )
    };
    std::fs::write(&file, svc(80)).unwrap();
    let source = ManifestSource::new(&dir).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || source.run(tx));
    let next = || rx.recv_timeout(std::time::Duration::from_secs(5)).expect("an event");
    assert!(matches!(next(), Event::Apply(_)));
    assert_eq!(next(), Event::Synced);
    // Truncate, pause, write.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&file).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(40));
        f.write_all(svc(81).as_bytes()).unwrap();
    }
    let e = next();
    assert!(
        matches!(&e, Event::Apply(Object::Service(s)) if s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port == 81),
        "{e:?}"
    );
    // Move away, pause, write anew (vim's save); an editor swap file.
    std::fs::rename(&file, dir.join("a.yaml~")).unwrap();
    std::fs::write(dir.join(".a.yaml.swp"), "binary junk").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(40));
    std::fs::write(&file, svc(82)).unwrap();
    let e = next();
    assert!(
        matches!(&e, Event::Apply(Object::Service(s)) if s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port == 82),
        "{e:?}"
    );
    // And a real deletion is one.
    std::fs::remove_file(&file).unwrap();
    assert!(matches!(next(), Event::Delete(_)));
    assert!(rx.recv_timeout(std::time::Duration::from_millis(500)).is_err(), "nothing more");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn directives_belong_to_the_next_document() {
    let text = "%YAML 1.2\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    let (objects, errors) = parse_documents(text);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(objects.len(), 1);
}

#[test]
fn an_object_made_invalid_keeps_its_last_good_version() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-lastgood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.yaml");
    std::fs::write(&file, GOOD).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    assert_eq!(source.poll().unwrap().len(), 2);

    let bump = |file: &std::path::Path, secs: u64| {
        let t = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
        std::fs::File::options().write(true).open(file).unwrap().set_modified(t).unwrap();
    };
    // The slice gets an invalid address: nothing changes downstream.
    std::fs::write(&file, GOOD.replace("10.1.0.5", "10.1.0.999")).unwrap();
    bump(&file, 1);
    assert!(source.poll().unwrap().is_empty(), "the last good slice stays");

    // The file stops being YAML at all: still nothing deleted.
    std::fs::write(&file, "apiVersion: v1\nkind: [unclosed\n").unwrap();
    bump(&file, 2);
    assert!(source.poll().unwrap().is_empty(), "a broken file keeps its objects");

    // Fixed, with a change: applied.
    std::fs::write(&file, GOOD.replace("10.1.0.5", "10.1.0.7")).unwrap();
    bump(&file, 3);
    let events = source.poll().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_duplicate_takes_over_when_the_first_definition_goes() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svc = |ip: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
        )
    };
    std::fs::write(dir.join("a.yaml"), svc("10.96.0.1")).unwrap();
    std::fs::write(dir.join("b.yaml"), svc("10.96.0.2")).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    let first = source.poll().unwrap();
    assert_eq!(first.len(), 1, "one object, defined twice: {first:?}");
    assert!(format!("{first:?}").contains("10.96.0.1"), "the first file wins");
    // a.yaml goes: b.yaml's definition (unchanged, not re-read) takes over.
    std::fs::remove_file(dir.join("a.yaml")).unwrap();
    let events = source.poll().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        matches!(&events[0], Event::Apply(Object::Service(s)) if s.spec.as_ref().unwrap().cluster_ip.as_deref() == Some("10.96.0.2"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_changed_file_is_compared_alone_and_duplicates_hand_over() {
    let dir = std::env::temp_dir().join(format!("kpx-manifests-handover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let svc = |name: &str, ip: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
        )
    };
    let (a, b) = (dir.join("a.yaml"), dir.join("b.yaml"));
    // a defines x and y; b defines y again (a's counts) and z.
    std::fs::write(&a, svc("svc-x", "10.96.0.1") + &svc("svc-y", "10.96.0.2")).unwrap();
    std::fs::write(&b, svc("svc-y", "10.96.0.20") + &svc("svc-z", "10.96.0.3")).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    let ips = |events: &[Event]| -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Apply(Object::Service(s)) => {
                    format!(
                        "{} {}",
                        s.metadata.name.as_deref().unwrap(),
                        s.spec.as_ref().unwrap().cluster_ip.as_deref().unwrap()
                    )
                }
                Event::Delete(r) => format!("-{}", r.name),
                other => format!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(ips(&source.poll().unwrap()), ["svc-x 10.96.0.1", "svc-y 10.96.0.2", "svc-z 10.96.0.3"]);
    // y leaves a: b's definition takes over; x, unchanged, is not reported.
    std::fs::write(&a, svc("svc-x", "10.96.0.1")).unwrap();
    assert_eq!(ips(&source.refresh(std::slice::from_ref(&a)).unwrap()), ["svc-y 10.96.0.20"]);
    // y comes back to a: a's counts again.
    std::fs::write(&a, svc("svc-x", "10.96.0.1") + &svc("svc-y", "10.96.0.2")).unwrap();
    assert_eq!(ips(&source.refresh(std::slice::from_ref(&a)).unwrap()), ["svc-y 10.96.0.2"]);
    // b goes: z is deleted, y (a's) stays as it is.
    std::fs::remove_file(&b).unwrap();
    assert_eq!(ips(&source.refresh(std::slice::from_ref(&b)).unwrap()), ["-svc-z"]);
    // a goes too: x and y are deleted.
    std::fs::remove_file(&a).unwrap();
    assert_eq!(ips(&source.refresh(std::slice::from_ref(&a)).unwrap()), ["-svc-x", "-svc-y"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_listing_that_fails_at_start_is_never_the_empty_state() {
    let dir = std::env::temp_dir().join(format!("kpx-unlisted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let source = ManifestSource::new(&dir).unwrap();
    // The directory goes away (a volume being swapped) before the first poll.
    std::fs::remove_dir_all(&dir).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || source.run(tx));
    let waited = rx.recv_timeout(std::time::Duration::from_millis(800));
    assert!(waited.is_err(), "nothing, not even Synced, while the manifests cannot be listed: {waited:?}");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("svc.yaml"), GOOD).unwrap();
    let mut events = Vec::new();
    while let Ok(e) = rx.recv_timeout(std::time::Duration::from_secs(3)) {
        let synced = e == Event::Synced;
        events.push(e);
        if synced {
            break;
        }
    }
    assert!(matches!(events.first(), Some(Event::Apply(_))), "{events:?}");
    assert_eq!(events.last(), Some(&Event::Synced));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_follow_the_api_servers_rules() {
    // Names end up in rule comments and object names: a name the API
    // server would refuse is refused here too, by object, and the others
    // still count.
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: "web\" -j ACCEPT", namespace: shop}
spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: "Shop;x"}
spec: {clusterIP: 10.96.0.12, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: 9lives}
spec: {clusterIP: 10.96.0.13, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: "-dash"}
spec: {clusterIP: 10.96.0.15, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: multi}
spec: {clusterIP: 10.96.0.14, ports: [{name: "HTTP\n", port: 80}, {name: dns, port: 53}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc.v1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.5]}]
ports: [{name: "a b", port: 8080}]
---
apiVersion: v1
kind: Node
metadata: {name: node-1.example.com}
"#;
    let (objects, errors) = parse_documents(text);
    let refs: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    // A Service name may start with a digit since v1.36
    // (RelaxedServiceNameValidation: a DNS-1123 label).
    assert_eq!(refs, ["Service default/9lives", "Node node-1.example.com"], "{errors:?}");
    let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let expect = [
        "metadata.name: \"web\\\" -j ACCEPT\" is not a DNS-1123 label",
        "metadata.namespace: \"Shop;x\" is not a DNS-1123 label",
        "metadata.name: \"-dash\" is not a DNS-1123 label",
        "spec.ports[0].name: \"HTTP\\n\" is not a DNS-1123 label",
        "ports[0].name: \"a b\" is not a DNS-1123 label",
    ];
    assert_eq!(messages.len(), expect.len(), "{messages:?}");
    for (m, e) in messages.iter().zip(expect) {
        assert!(m.contains(e), "{m:?} should say {e:?}");
    }
}

/// A ConfigMap volume swaps its files through symbolic links: for a moment
/// a manifest's link can point nowhere. Its objects stay, and a source
/// that never read it is not complete.
#[test]
fn a_dangling_manifest_link_keeps_its_objects() {
    let dir = std::env::temp_dir().join(format!("kpx-dangling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/web.txt"), GOOD).unwrap();
    std::os::unix::fs::symlink("data/web.txt", dir.join("web.yaml")).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    assert_eq!(source.poll().unwrap().len(), 2);
    assert!(source.is_complete());
    std::fs::remove_file(dir.join("data/web.txt")).unwrap();
    assert_eq!(source.poll().unwrap(), [], "a dangling link deletes nothing");
    assert!(source.is_complete(), "its last good objects stand in");
    // A source that never read the file cannot report a complete state.
    let mut fresh = ManifestSource::new(&dir).unwrap();
    let _ = fresh.poll().unwrap();
    assert!(!fresh.is_complete());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One inotify note, as the watcher sends it.
fn note(kind: notify::EventKind, paths: &[&str]) -> Option<notify::Result<notify::Event>> {
    let mut e = notify::Event::new(kind);
    for p in paths {
        e = e.add_path(PathBuf::from(p));
    }
    Some(Ok(e))
}

#[test]
fn only_renames_into_place_are_read_without_waiting() {
    use notify::EventKind::{Access, Create, Modify, Remove};
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RemoveKind, RenameMode};
    let to = || Modify(ModifyKind::Name(RenameMode::To));
    // What the source holds: a file, and a directory with a dot in its name.
    let held = |p: &Path| p == Path::new("/m/web.yaml") || p == Path::new("/m/conf.d");
    let settled = |notes: Vec<Option<notify::Result<notify::Event>>>| {
        let mut s = Settling::default();
        for n in &notes {
            s.note(n, held);
        }
        s.finished()
    };
    // A file written elsewhere and renamed into place: at once.
    assert!(settled(vec![note(to(), &["/m/web.yaml"])]));
    // A temporary file in the directory, written, then renamed over the manifest.
    assert!(settled(vec![
        note(Create(CreateKind::File), &["/m/web.yaml.tmp"]),
        note(Modify(ModifyKind::Data(DataChange::Any)), &["/m/web.yaml.tmp"]),
        note(Access(AccessKind::Close(AccessMode::Write)), &["/m/web.yaml.tmp"]),
        note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/web.yaml.tmp"]),
        note(to(), &["/m/web.yaml"]),
        note(Modify(ModifyKind::Name(RenameMode::Both)), &["/m/web.yaml.tmp", "/m/web.yaml"]),
    ]));
    // Written in place (it may be truncated and written in steps): waits.
    assert!(!settled(vec![
        note(Modify(ModifyKind::Data(DataChange::Any)), &["/m/web.yaml"]),
        note(Access(AccessKind::Close(AccessMode::Write)), &["/m/web.yaml"]),
    ]));
    // An editor moving the manifest away before writing it again: waits,
    // even once the new one is renamed in (the old name is gone).
    assert!(!settled(vec![note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/web.yaml"])]));
    assert!(!settled(vec![
        note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/web.yaml"]),
        note(to(), &["/m/web.yaml~"]),
        note(Modify(ModifyKind::Name(RenameMode::Both)), &["/m/web.yaml", "/m/web.yaml~"]),
    ]));
    // A removed manifest, or a directory going: waits, whatever its name.
    assert!(!settled(vec![note(Remove(RemoveKind::File), &["/m/web.yaml"])]));
    assert!(!settled(vec![note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/team-a"])]));
    assert!(!settled(vec![note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/conf.d"])]));
    assert!(!settled(vec![
        note(Modify(ModifyKind::Name(RenameMode::From)), &["/m/conf.d"]),
        note(to(), &["/m/conf.d"]),
        note(Modify(ModifyKind::Name(RenameMode::Both)), &["/m/conf.d", "/m/old.d"]),
    ]));
    // A temporary file the source never held, going: nothing to wait for.
    assert!(settled(vec![note(Remove(RemoveKind::File), &["/m/web.yaml.tmp"])]));
    // Lost notes: waits, and the change is read in full.
    assert!(!settled(vec![note(to(), &["/m/web.yaml"]), None]));
}

#[test]
fn notes_that_ask_for_a_full_read_lose_nothing() {
    use notify::EventKind::{Create, Modify};
    use notify::event::{CreateKind, DataChange, ModifyKind};
    let dir = std::env::temp_dir().join(format!("kpx-manifests-notes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("a.yaml");
    std::fs::write(&a, GOOD).unwrap();
    let mut source = ManifestSource::new(&dir).unwrap();
    assert_eq!(source.poll().unwrap().len(), 2);
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let modified = |p: &Path| note(Modify(ModifyKind::Data(DataChange::Any)), &[&path(p)]);
    // Same-length edits: the mtime is moved on so that the stamp changes.
    let bump = |file: &Path, secs: u64| {
        let t = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
        std::fs::File::options().write(true).open(file).unwrap().set_modified(t).unwrap();
    };
    // Lost notes beside a named change: the full read still reports it.
    std::fs::write(&a, GOOD.replace("10.1.0.5", "10.1.0.6")).unwrap();
    bump(&a, 1);
    let events = source.apply_notes(vec![modified(&a), None]).unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    // A named change beside a new directory (which asks for a full read
    // after the change was read): still reported.
    std::fs::write(&a, GOOD.replace("10.1.0.5", "10.1.0.7")).unwrap();
    bump(&a, 2);
    std::fs::create_dir_all(dir.join("team-b")).unwrap();
    let events = source
        .apply_notes(vec![modified(&a), note(Create(CreateKind::Folder), &[&path(&dir.join("team-b"))])])
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    // A writer's temporary manifest, never read, gone again: no trace.
    let events = source
        .apply_notes(vec![note(
            notify::EventKind::Remove(notify::event::RemoveKind::File),
            &[&path(&dir.join("tmp-1.yaml"))],
        )])
        .unwrap();
    assert!(events.is_empty() && source.touched.is_empty(), "{events:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Aliases that expand to far more than the text holds: nested (9^9
/// strings), flat (10^8 from 70 KB) and two levels wide (9 x 10^8 from
/// 33 KB). Each is refused in bounded time, the document after them kept.
#[test]
fn alias_bombs_and_deep_nesting_are_refused_in_bounded_time_and_the_others_kept() {
    let head = |name: &str| format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\n");
    let mut nested = head("nested") + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
    for i in 1..9 {
        let p = i - 1;
        nested.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
    }
    let items = |what: &str, n: usize| vec![what; n].join(", ");
    let flat = head("flat") + &format!("a: &a [{}]\nb: [{}]\n", items("x", 10_000), items("*a", 10_000));
    let wide = head("wide")
        + &format!("a: &a [{}]\nb: &b [{}]\nc: [{}]\n", items("x", 10_000), items("*a", 300), items("*b", 300));
    let deep = head("deep") + &format!("spec: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let good =
        "apiVersion: v1\nkind: Service\nmetadata: {name: fine}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    let text = format!("---\n{nested}---\n{flat}---\n{wide}---\n{deep}---\n{good}");
    let started = std::time::Instant::now();
    let (objects, errors) = parse_documents(&text);
    // Each bomb stops at its budget (a few nodes and string bytes per
    // byte of its text): 1.2 s for the whole text in a debug build here
    // (serde-saphyr's replay budget took 3.5-4.2 s per bomb).
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
    let names: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(names, ["Service default/fine"]);
    let documents: Vec<usize> = errors.iter().map(|e| e.document).collect();
    assert_eq!(documents, [1, 2, 3, 4], "{errors:?}");
    assert!(errors.iter().all(|e| e.message.starts_with("not valid YAML")), "{errors:?}");
}

/// YAML's merge keys and duplicate keys, as kubectl reads them: a merge
/// fills the mapping, a key given twice refuses the document.
#[test]
fn merge_keys_merge_and_duplicate_keys_refuse_the_document() {
    let text = "---\ncommon: &common {namespace: shop}\napiVersion: v1\nkind: Service\nmetadata: {<<: *common, name: merged}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: twice, name: again}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n";
    let (objects, errors) = parse_documents(text);
    let names: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(names, ["Service shop/merged"]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].document, 2);
}
