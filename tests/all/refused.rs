//! Objects the API server would refuse, written to --manifests, where no
//! API server stands in front of kpx: a Service with port 70000, one with
//! two IPv4 cluster IPs, external IPs 0.0.0.0 and 127.0.0.1, EndpointSlices
//! with endpoints 127.0.0.1 and 169.254.169.254 and one with port 0. Each
//! is refused in the log (warn) by kind, namespace/name and reason, and
//! counted in `kpx_objects_refused_total`; none reaches the kernel, and the
//! good objects beside them are programmed. (The API source's undecodable
//! objects: `api_source::an_undecodable_object_*`.)

use std::time::Duration;

use kpx_netlab::node::NodeLab;

use crate::support::*;

const WEB: &str = "10.96.0.10:80";

/// A Service of namespace `test` with this spec.
fn service_with(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec: {{{spec}}}\n---\n")
}

/// An EndpointSlice of Service `web` with one endpoint, on `port`.
fn slice_with(name: &str, port: u16, address: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: test, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: tcp, port: {port}, protocol: TCP}}]\nendpoints: [{{addresses: [\"{address}\"], conditions: {{ready: true}}}}]\n---\n"
    )
}

/// The hostile documents, and what the log must say of each: (object,
/// reason).
fn hostile() -> (String, Vec<(&'static str, &'static str)>) {
    let tcp = "ports: [{name: tcp, port: 80, protocol: TCP}]";
    let text = [
        service_with("port-70000", "clusterIP: 10.96.0.21, ports: [{name: tcp, port: 70000, protocol: TCP}]"),
        service_with("two-v4", &format!("clusterIP: 10.96.0.22, clusterIPs: [10.96.0.22, 10.96.0.122], {tcp}")),
        service_with("ext-any", &format!("clusterIP: 10.96.0.23, externalIPs: [0.0.0.0], {tcp}")),
        service_with("ext-lo", &format!("clusterIP: 10.96.0.24, externalIPs: [127.0.0.1], {tcp}")),
        slice_with("web-lo", 8080, "127.0.0.1"),
        slice_with("web-metadata", 8080, "169.254.169.254"),
        slice_with("web-port-0", 0, "10.244.1.77"),
    ]
    .concat();
    let said = vec![
        ("Service test/port-70000", "spec.ports[0].port: 70000 is not a valid port number"),
        ("Service test/two-v4", "are both IPv4: at most one address per IP family"),
        ("Service test/ext-any", "spec.externalIPs[0]: \"0.0.0.0\" may not be unspecified"),
        ("Service test/ext-lo", "spec.externalIPs[0]: \"127.0.0.1\" may not be in the loopback range"),
        ("EndpointSlice test/web-lo", "\"127.0.0.1\" may not be in the loopback range"),
        ("EndpointSlice test/web-metadata", "\"169.254.169.254\" may not be in the link-local range"),
        ("EndpointSlice test/web-port-0", "ports[0].port: 0 is not a valid port number"),
    ];
    (text, said)
}

/// The mode's rules as the kernel lists them.
fn rules(lab: &NodeLab, mode: &str) -> String {
    match mode {
        "iptables" => kernel_rules(lab),
        _ => lab.node.exec(&["nft", "list", "ruleset"]).expect("nft list ruleset"),
    }
}

/// One sample of `kpx_objects_refused_total`.
fn refused(lab: &NodeLab, kind: &str) -> Option<u64> {
    let (_, text) = crate::servers::get(&lab.node, "127.0.0.1:10249", "/metrics").expect("metrics");
    let series = format!("kpx_objects_refused_total{{kind=\"{kind}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.trim().parse().ok())
}

fn hostile_manifests_are_refused_by_name(mode: &str) {
    let Some(lab) = lab_or_skip(1, &format!("hostile_manifests_are_refused_by_name ({mode})")) else { return };
    let (dir, manifests) = run_dirs(&format!("refused-{mode}"));
    let be1 = lab.backends[0].ip.clone();
    write_web(&manifests, &[&be1]);
    let (text, said) = hostile();
    write_manifest(&manifests.join("hostile.yaml"), &text);
    let args = kpx_args(&manifests, &["--proxy-mode", mode]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)), "{mode}:\n{}", kpx.log());
    assert_eq!(servers_seen(&lab, Proto::Tcp, WEB, 5), [("be1".to_string(), 5)].into(), "{mode}:\n{}", kpx.log());
    let log = kpx.log();
    for (object, reason) in &said {
        let line = log.lines().find(|l| l.contains(&format!("({object}): ")));
        let line = line.unwrap_or_else(|| panic!("{mode}: {object} is not named in the log:\n{log}"));
        assert!(line.contains("WARN") && line.contains("rejected") && line.contains(reason), "{mode}: {line}");
    }
    let programmed = rules(&lab, mode);
    // The refused endpoints, and the refused Services' cluster IPs.
    let endpoints = ["127.0.0.1:8080", "169.254.169.254", "10.244.1.77"];
    let cluster_ips = ["10.96.0.21", "10.96.0.22", "10.96.0.23", "10.96.0.24"];
    for absent in endpoints.iter().chain(&cluster_ips) {
        assert!(!programmed.contains(absent), "{mode}: {absent} reached the kernel:\n{programmed}");
    }
    assert!(programmed.contains(&be1), "{mode}: web's endpoint is not programmed:\n{programmed}");
    assert_eq!((refused(&lab, "Service"), refused(&lab, "EndpointSlice")), (Some(4), Some(3)), "{mode}");
    assert!(kpx.is_running(), "{mode}: kpx exited:\n{}", kpx.log());
}

#[test]
fn hostile_manifests_are_refused_by_name_iptables() {
    hostile_manifests_are_refused_by_name("iptables");
}

#[test]
fn hostile_manifests_are_refused_by_name_nftables() {
    hostile_manifests_are_refused_by_name("nftables");
}
