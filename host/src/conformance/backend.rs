//! The kit for backend components: the contract, the flows through the
//! tracer, and hostile but valid inputs.

use kpx_rules::model::{Change, IpFamily, ProxyMode, ServicePort};
use kpx_rules::ops::Ruleset;

use super::Report;
use super::cases::Case;
use super::tracer::{self, Host, Inputs, inputs, render};
use crate::runtime::{BackendPlugin, objects};

/// The mode whose rules the component returns for the first case, asked
/// in each mode in turn (a backend may refuse settings of another mode).
pub fn mode_of(plugin: &BackendPlugin, params: &[String]) -> Result<ProxyMode, String> {
    let case = Case::all().into_iter().next().expect("the cases are embedded");
    let mut refusals = Vec::new();
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs] {
        match render(plugin, &case, mode, IpFamily::V4, params) {
            Ok(rendered) => return Ok(kind_of(&rendered.ruleset)),
            Err(e) => refusals.push(format!("{mode}: {e}")),
        }
    }
    Err(format!("cannot tell the component's mode (name it with --mode): {}", refusals.join("; ")))
}

/// Every check of a backend in `mode`.
/// `params`: the backend's `--backend-param KEY=VALUE`s.
pub fn check(report: &mut Report, plugin: &BackendPlugin, mode: ProxyMode, params: &[String]) {
    contract(report, plugin, mode, params);
    tracer::flows(report, plugin, mode, params);
    hostile(report, plugin, mode, params);
}

const SAME_RULES: &str = "contract: fresh instances render the same rules";
const RULES_OF_MODE: &str = "contract: the mode's kind of rules";
const INCREMENTAL: &str = "contract: changes applied one by one render what a reset renders";
const PARTIAL: &str = "contract: partial renders pass the host's checks";

fn kind_of(ruleset: &Ruleset) -> ProxyMode {
    match ruleset {
        Ruleset::Iptables(_) => ProxyMode::Iptables,
        Ruleset::Nftables(_) => ProxyMode::Nftables,
        Ruleset::Ipvs(_) => ProxyMode::Ipvs,
    }
}

/// The contract's promises, on every case's state.
fn contract(report: &mut Report, plugin: &BackendPlugin, mode: ProxyMode, params: &[String]) {
    for case in Case::all() {
        for family in [IpFamily::V4, IpFamily::V6] {
            let label = format!("{} ({family})", case.label());
            let (first, second) =
                match (render(plugin, &case, mode, family, params), render(plugin, &case, mode, family, params)) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(e), _) | (_, Err(e)) => {
                        report.row(SAME_RULES).fail(format!("{label}: {e}"));
                        continue;
                    }
                };
            if first.ports.is_empty() {
                continue;
            }
            report.row(RULES_OF_MODE).record(match kind_of(&first.ruleset) {
                kind if kind == mode => Ok(()),
                kind => Err(format!("{label}: {kind} rules in {mode} mode")),
            });
            report.row(SAME_RULES).record(if first.ruleset == second.ruleset {
                Ok(())
            } else {
                Err(format!("{label}: two fresh instances rendered different rules for the same state"))
            });
            match incremental(plugin, &case, mode, family, params, &first.ruleset) {
                Ok(partials) => {
                    report.row(INCREMENTAL).pass();
                    for _ in 0..partials {
                        report.row(PARTIAL).pass();
                    }
                }
                Err((row, why)) => report.row(row).fail(format!("{label}: {why}")),
            }
        }
    }
}

/// From an empty state, each service port added with `apply` and a
/// partial render checked by the host; then the full render compared with
/// a reset's (`expected`), and the same after the first port is removed.
/// The number of partial renders the host accepted.
fn incremental(
    plugin: &BackendPlugin,
    case: &Case,
    mode: ProxyMode,
    family: IpFamily,
    params: &[String],
    expected: &Ruleset,
) -> Result<usize, (&'static str, String)> {
    let Inputs { settings, node, cluster, ports } = inputs(case, mode, family, params).map_err(|e| (INCREMENTAL, e))?;
    let fail = |e: crate::runtime::Error| (INCREMENTAL, e.to_string());
    let mut instance = plugin.instantiate(&settings).map_err(fail)?;
    instance.reset(&node, &cluster, &[]).map_err(fail)?;
    let mut host = Host::new(plugin.name(), &settings, &[]);
    let empty = instance.render(true, 0).map_err(fail)?;
    host.accept(&empty, true).map_err(|e| (INCREMENTAL, format!("the empty state's rules: {e}")))?;
    let mut partials = 0;
    for (i, port) in ports.iter().enumerate() {
        instance.apply(&[Change::Upsert(port.clone())]).map_err(fail)?;
        let partial = instance.render(false, port.size()).map_err(fail)?;
        host.rescope(&ports[..=i]);
        host.accept(&partial, false).map_err(|e| (PARTIAL, format!("after adding {}: {e}", port.key)))?;
        partials += 1;
    }
    let full = instance.render(true, objects(&ports)).map_err(fail)?;
    if &full != expected {
        return Err((INCREMENTAL, format!("{} ports added one by one render other rules than a reset", ports.len())));
    }
    // An update: the first port with an endpoint gives up its last one.
    let mut ports = ports;
    if let Some(i) = ports.iter().position(|p| !p.endpoints.is_empty()) {
        let mut port = ports[i].clone();
        let gone = port.endpoints.len() as u32 - 1;
        port.endpoints.pop();
        port.cluster_endpoints.retain(|&e| e != gone);
        port.local_endpoints.retain(|&e| e != gone);
        instance.apply(&[Change::Upsert(port.clone())]).map_err(fail)?;
        let partial = instance.render(false, port.size()).map_err(fail)?;
        ports[i] = port.clone();
        host.rescope(&ports);
        host.accept(&partial, false).map_err(|e| (PARTIAL, format!("after {} lost an endpoint: {e}", port.key)))?;
        partials += 1;
        let updated = instance.render(true, objects(&ports)).map_err(fail)?;
        let mut fresh = plugin.instantiate(&settings).map_err(fail)?;
        fresh.reset(&node, &cluster, &ports).map_err(fail)?;
        if updated != fresh.render(true, objects(&ports)).map_err(fail)? {
            return Err((
                INCREMENTAL,
                format!("after {} lost an endpoint, other rules than a reset renders", port.key),
            ));
        }
    }
    let rest: Vec<ServicePort> = ports[1..].to_vec();
    instance.apply(&[Change::Remove(ports[0].key.clone())]).map_err(fail)?;
    let partial = instance.render(false, 1).map_err(fail)?;
    host.rescope(&rest);
    host.accept(&partial, false).map_err(|e| (PARTIAL, format!("after removing {}: {e}", ports[0].key)))?;
    partials += 1;
    let after = instance.render(true, objects(&rest)).map_err(fail)?;
    let mut fresh = plugin.instantiate(&settings).map_err(fail)?;
    fresh.reset(&node, &cluster, &rest).map_err(fail)?;
    if after != fresh.render(true, objects(&rest)).map_err(fail)? {
        return Err((INCREMENTAL, format!("after removing {}, other rules than a reset renders", ports[0].key)));
    }
    Ok(partials)
}

/// Hostile but valid states: a component must render them (no trap, no
/// error, within its fuel) into rules the host accepts.
fn hostile(report: &mut Report, plugin: &BackendPlugin, mode: ProxyMode, params: &[String]) {
    for (what, case) in hostile_cases() {
        let row = format!("hostile input: {what}");
        for family in [IpFamily::V4, IpFamily::V6] {
            let outcome = render(plugin, &case, mode, family, params).and_then(|r| {
                Host::new(plugin.name(), &r.settings, &r.ports)
                    .accept(&r.ruleset, true)
                    .map_err(|e| format!("the host refuses the rules: {e}"))
            });
            report.row(&row).record(outcome.map_err(|e| format!("{family}: {e}")));
        }
    }
}

const NODE: &str =
    "node: {name: node-a, addresses: [192.168.0.2, \"fd00::2\"], podCIDRs: [10.0.1.0/24, \"fd00:1::/64\"]}";

fn slice(ns: &str, service: &str, name: &str, family: &str, ports: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: {ns}, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: {family}\nports: [{ports}]\nendpoints: [{endpoints}]\n"
    )
}

/// The hostile inputs, each a case without flows.
pub fn hostile_cases() -> Vec<(&'static str, Case)> {
    let case = |about: &str, manifests: String| {
        let text = format!(
            "about: {about:?}\nflags: [--cluster-cidr, 10.0.0.0/8]\n{NODE}\nmanifests: {:?}\nflows: []\n",
            manifests
        );
        Case::parse("hostile.yaml", &text).unwrap_or_else(|e| panic!("a hostile case: {e}"))
    };
    let mut out = Vec::new();

    let (ns, svc, port) = ("n".repeat(63), "s".repeat(63), "p".repeat(15));
    // A DNS-1123 subdomain of 253 characters: labels of 63, 63, 63 and 61.
    let long_slice = ["e".repeat(63), "e".repeat(63), "e".repeat(63), "e".repeat(61)].join(".");
    out.push((
        "longest names (63-character namespace and Service, 15-character port, 253-character slice)",
        case(
            "longest names",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec: {{type: NodePort, clusterIP: 172.30.0.10, externalIPs: [192.0.2.10], ports: [{{name: {port}, port: 80, nodePort: 30010}}]}}\n---\n{}",
                slice(&ns, &svc, &long_slice, "IPv4", &format!("{{name: {port}, port: 8080}}"), "{addresses: [10.0.2.1]}")
            ),
        ),
    ));

    let many: Vec<String> = (0..1000).map(|i| format!("{{addresses: [10.1.{}.{}]}}", i / 250, i % 250 + 1)).collect();
    out.push((
        "1,000 endpoints on one port",
        case(
            "1000 endpoints",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: big, namespace: ns}}\nspec: {{clusterIP: 172.30.0.11, ports: [{{name: p, port: 80}}]}}\n---\n{}",
                slice("ns", "big", "big-1", "IPv4", "{name: p, port: 8080}", &many.join(", "))
            ),
        ),
    ));

    let ports: Vec<String> = (1..=1000).map(|i| format!("{{name: p{i}, port: {i}}}")).collect();
    let targets: Vec<String> = (1..=1000).map(|i| format!("{{name: p{i}, port: {}}}", 10000 + i)).collect();
    out.push((
        "1,000 ports on one Service",
        case(
            "1000 ports",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: wide, namespace: ns}}\nspec: {{clusterIP: 172.30.0.12, ports: [{}]}}\n---\n{}",
                ports.join(", "),
                slice("ns", "wide", "wide-1", "IPv4", &targets.join(", "), "{addresses: [10.0.2.2]}")
            ),
        ),
    ));

    out.push((
        "every address kind and policy on one Service",
        case(
            "everything at once",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: all, namespace: ns}}\nspec: {{type: LoadBalancer, clusterIP: 172.30.0.13, clusterIPs: [172.30.0.13, \"fd00:30::13\"], ipFamilies: [IPv4, IPv6], ipFamilyPolicy: PreferDualStack, externalIPs: [192.0.2.13, \"2001:db8::13\"], loadBalancerSourceRanges: [198.51.100.0/24, \"2001:db8:1::/48\"], externalTrafficPolicy: Local, internalTrafficPolicy: Local, healthCheckNodePort: 30999, sessionAffinity: ClientIP, sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 86400}}}}, ports: [{{name: p, port: 443, nodePort: 30013}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 203.0.113.13}}, {{ip: \"2001:db8:2::13\"}}]}}}}\n---\n{}---\n{}",
                slice(
                    "ns",
                    "all",
                    "all-4",
                    "IPv4",
                    "{name: p, port: 8443}",
                    "{addresses: [10.0.1.5], nodeName: node-a}, {addresses: [10.0.9.5], nodeName: node-b}, {addresses: [10.0.1.6], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}"
                ),
                slice(
                    "ns",
                    "all",
                    "all-6",
                    "IPv6",
                    "{name: p, port: 8443}",
                    "{addresses: [\"fd00:1::5\"], nodeName: node-a}, {addresses: [\"fd00:9::5\"], nodeName: node-b}"
                )
            ),
        ),
    ));

    out.push((
        "no endpoints, only terminating ones, only unready ones",
        case(
            "empty and dying",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: none, namespace: ns}}\nspec: {{type: NodePort, clusterIP: 172.30.0.14, ports: [{{name: p, port: 80, nodePort: 30014}}]}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: dying, namespace: ns}}\nspec: {{clusterIP: 172.30.0.15, ports: [{{name: p, port: 80}}]}}\n---\n{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: unready, namespace: ns}}\nspec: {{clusterIP: 172.30.0.16, ports: [{{name: p, port: 80}}]}}\n---\n{}",
                slice(
                    "ns",
                    "dying",
                    "dying-1",
                    "IPv4",
                    "{name: p, port: 8080}",
                    "{addresses: [10.0.2.5], conditions: {ready: false, serving: true, terminating: true}}"
                ),
                slice(
                    "ns",
                    "unready",
                    "unready-1",
                    "IPv4",
                    "{name: p, port: 8080}",
                    "{addresses: [10.0.2.6], conditions: {ready: false, serving: false, terminating: false}}"
                )
            ),
        ),
    ));

    out.push((
        "TCP, UDP and SCTP on one port number; port 65535; node port 32767",
        case(
            "protocols and edges",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: edge, namespace: ns}}\nspec: {{type: NodePort, clusterIP: 172.30.0.17, ports: [{{name: t, port: 65535, protocol: TCP, nodePort: 32767}}, {{name: u, port: 65535, protocol: UDP, nodePort: 32767}}, {{name: s, port: 65535, protocol: SCTP, nodePort: 32766}}]}}\n---\n{}",
                slice(
                    "ns",
                    "edge",
                    "edge-1",
                    "IPv4",
                    "{name: t, port: 65535, protocol: TCP}, {name: u, port: 65535, protocol: UDP}, {name: s, port: 65535, protocol: SCTP}",
                    "{addresses: [10.0.2.7]}"
                )
            ),
        ),
    ));

    out.push(("an empty state", case("nothing", String::new())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hostile_cases_build_the_states_they_name() {
        for (what, case) in hostile_cases() {
            let state = case.state().unwrap_or_else(|e| panic!("{what}: {e}"));
            let v4 = case.service_ports(&state, IpFamily::V4);
            let v6 = case.service_ports(&state, IpFamily::V6);
            let endpoints: usize = v4.iter().map(|p| p.endpoints.len()).sum();
            match what {
                w if w.starts_with("1,000 endpoints") => assert_eq!(endpoints, 1000, "{what}"),
                w if w.starts_with("1,000 ports") => assert_eq!(v4.len(), 1000, "{what}"),
                w if w.starts_with("longest") => assert_eq!(v4[0].namespace.len(), 63, "{what}"),
                w if w.starts_with("every address") => {
                    assert!(!v4[0].external_ips.is_empty() && !v4[0].load_balancer_ips.is_empty(), "{what}: {v4:?}");
                    assert_eq!(v6.len(), 1, "{what}");
                }
                w if w.starts_with("TCP, UDP") => assert_eq!(v4.len(), 3, "{what}"),
                w if w.starts_with("no endpoints") => assert_eq!(v4.len(), 3, "{what}"),
                _ => assert!(v4.is_empty(), "{what}"),
            }
        }
    }
}
