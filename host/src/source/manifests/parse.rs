//! Parsing and checking manifest documents. Each document is checked on
//! its own: a bad one is reported, the others still count.

use std::net::IpAddr;

use kpx_rules::model::parse_ip_sloppy as sloppy;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde_json::Value;

use std::sync::Arc;

use crate::source::slice::{Placements, Slice};
use crate::source::{Kind, Object, ObjectRef};

/// Why one document was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based position of the document in its file.
    pub document: usize,
    /// Its kind, when it is one kpx reads (what the refusal is counted as).
    pub kind: Option<Kind>,
    /// `Kind namespace/name` (a namespaced kind's namespace defaulted, as
    /// the API server defaults it), when known.
    pub object: Option<String>,
    /// The object the document meant to define, when it is one of ours
    /// and names itself: its last good version is kept.
    pub object_ref: Option<ObjectRef>,
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.object {
            Some(o) => write!(f, "document {} ({o}): {}", self.document, self.message),
            None => write!(f, "document {}: {}", self.document, self.message),
        }
    }
}

/// The Service, EndpointSlice and Node objects of a YAML or JSON text,
/// and an error for each document that is not valid. Other kinds are
/// skipped.
/// A file of many documents (a cluster's dump) is parsed on up to
/// [`PARSE_THREADS`] threads, each a contiguous run of documents; the
/// result is in the file's order either way.
pub fn parse_documents(text: &str) -> (Vec<Object>, Vec<ParseError>) {
    let docs = split_documents(text);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(PARSE_THREADS);
    if threads < 2 || docs.len() < PARALLEL_DOCUMENTS {
        return parse_run(&docs, 1);
    }
    let run = docs.len().div_ceil(threads);
    let parsed: Vec<_> = std::thread::scope(|scope| {
        // A run whose thread cannot be had (a tight pids limit) is parsed
        // here, after the others are started.
        let started: Vec<_> = docs
            .chunks(run)
            .enumerate()
            .map(|(i, chunk)| {
                let first = 1 + i * run;
                (std::thread::Builder::new().spawn_scoped(scope, move || parse_run(chunk, first)).ok(), chunk, first)
            })
            .collect();
        started
            .into_iter()
            .map(|(handle, chunk, first)| match handle {
                Some(h) => h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => parse_run(chunk, first),
            })
            .collect()
    });
    let (mut objects, mut errors) = (Vec::new(), Vec::new());
    for (o, e) in parsed {
        objects.extend(o);
        errors.extend(e);
    }
    (objects, errors)
}

/// Threads for one file's documents, at most.
const PARSE_THREADS: usize = 4;
/// Fewer documents than this are parsed on the calling thread.
pub(super) const PARALLEL_DOCUMENTS: usize = 512;

/// Documents numbered from `first` on.
fn parse_run(docs: &[std::borrow::Cow<'_, str>], first: usize) -> (Vec<Object>, Vec<ParseError>) {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    let mut placements = Placements::default();
    for (i, doc) in docs.iter().enumerate() {
        let document = first + i;
        if blank(doc) {
            continue;
        }
        match super::yaml::parse(doc) {
            Ok(value) => collect(value, document, &mut objects, &mut errors, &mut placements),
            Err(e) => errors.push(ParseError {
                document,
                kind: None,
                object: None,
                object_ref: None,
                message: format!("not valid YAML: {}", e.lines().next().unwrap_or("")),
            }),
        }
    }
    (objects, errors)
}

/// A YAML stream's documents: split at the `---` markers (a marker line
/// starts at column 0, and ends any block scalar, so this is YAML's own
/// split); a `---` followed by content on its line keeps that content.
/// Each document is parsed on its own, so one that is not valid YAML
/// leaves the others.
fn split_documents(text: &str) -> Vec<std::borrow::Cow<'_, str>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t") || bare == "..." {
            out.push(&text[start..offset]);
            // Content after the marker on its line belongs to the next document.
            start = if bare == "..." { offset + line.len() } else { offset + 3 };
        }
        offset += line.len();
    }
    out.push(&text[start..]);
    // Comments or nothing before the first marker are not a document.
    if out.len() > 1 && blank(out[0]) {
        out.remove(0);
    }
    // Directives (`%YAML`, `%TAG`) belong to the document after them.
    let mut docs: Vec<std::borrow::Cow<'_, str>> = Vec::new();
    let mut pending: Option<&str> = None;
    for chunk in out {
        let directives = chunk.lines().any(|l| l.starts_with('%'))
            && chunk.lines().all(|l| l.starts_with('%') || l.trim().is_empty() || l.trim_start().starts_with('#'));
        match pending.take() {
            Some(d) => docs.push(format!("{d}---{chunk}").into()),
            None if directives => pending = Some(chunk),
            None => docs.push(chunk.into()),
        }
    }
    docs.extend(pending.map(Into::into));
    docs
}

fn blank(doc: &str) -> bool {
    doc.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
}

fn collect(
    value: Value,
    document: usize,
    objects: &mut Vec<Object>,
    errors: &mut Vec<ParseError>,
    placements: &mut Placements,
) {
    if value.is_null() {
        return;
    }
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let meta = |key: &str| value.get("metadata").and_then(|m| m.get(key)).and_then(|v| v.as_str()).map(str::to_string);
    let kind_of = match kind.as_str() {
        "Service" => Some(Kind::Service),
        "EndpointSlice" => Some(Kind::EndpointSlice),
        "Node" => Some(Kind::Node),
        "ServiceCIDR" => Some(Kind::ServiceCidr),
        _ => None,
    };
    let object_ref = kind_of.zip(meta("name")).map(|(kind, name)| ObjectRef {
        kind,
        namespace: if matches!(kind, Kind::Node | Kind::ServiceCidr) {
            String::new()
        } else {
            meta("namespace").unwrap_or_else(|| "default".into())
        },
        name,
    });
    // Named as the object will be: its namespace defaulted.
    let label = match (&object_ref, meta("namespace"), meta("name")) {
        (Some(r), _, _) => r.to_string(),
        (None, Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, None, Some(name)) => format!("{kind} {name}"),
        _ => kind.clone(),
    };
    let mut fail = |message: String| {
        errors.push(ParseError {
            document,
            kind: kind_of,
            object: Some(label.clone()),
            object_ref: object_ref.clone(),
            message,
        })
    };
    let result = match (api_version.as_str(), kind.as_str()) {
        (_, "List") => {
            // Moved out, not copied: a List of Lists would copy its tree
            // once per level.
            let items = match value {
                Value::Object(mut fields) => fields.remove("items"),
                _ => None,
            };
            match items {
                Some(Value::Array(items)) => {
                    for item in items {
                        collect(item, document, objects, errors, placements);
                    }
                }
                // As kubectl: a List with no items is an empty one.
                None | Some(Value::Null) => {}
                Some(_) => errors.push(ParseError {
                    document,
                    kind: None,
                    object: None,
                    object_ref: None,
                    message: "a List's items must be a sequence".into(),
                }),
            }
            return;
        }
        ("v1", "Service") => {
            typed::<Service>(value).and_then(check_service).map(|o| Object::Service(Arc::new(o.into())))
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => typed::<EndpointSlice>(value)
            .and_then(check_slice)
            .map(|o| Object::EndpointSlice(Arc::new(Slice::new(o, placements)))),
        ("v1", "Node") => typed::<Node>(value).and_then(check_node).map(|o| Object::Node(Arc::new(o))),
        ("networking.k8s.io/v1", "ServiceCIDR") => {
            typed::<ServiceCIDR>(value).and_then(check_service_cidr).map(|o| Object::ServiceCidr(Arc::new(o)))
        }
        (_, "ServiceCIDR") => Err(format!("unsupported apiVersion {api_version:?} (want networking.k8s.io/v1)")),
        (_, "Service" | "Node") => Err(format!("unsupported apiVersion {api_version:?} (want v1)")),
        (_, "EndpointSlice") => Err(format!("unsupported apiVersion {api_version:?} (want discovery.k8s.io/v1)")),
        ("", "") => Err("not a Kubernetes object (no apiVersion and kind)".into()),
        _ => return,
    };
    match result {
        Ok(object) => objects.push(object),
        Err(message) => fail(message),
    }
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// The API server's rules for a name (apimachinery's validation).
#[derive(Debug, Clone, Copy)]
enum NameRule {
    /// DNS-1123 label: Service names (RelaxedServiceNameValidation, on
    /// since v1.36: a DNS-1035 label before, no leading digit), namespaces,
    /// port names.
    Dns1123Label,
    /// DNS-1123 subdomain: EndpointSlice, Node and ServiceCIDR names.
    Dns1123Subdomain,
}

/// Why `name` breaks `rule`, if it does. The names end up in rule
/// comments and object names, so kpx holds them to what the API server
/// accepts rather than to what a file may contain.
fn name_problem(name: &str, rule: NameRule) -> Option<String> {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && l.starts_with(|c: char| c.is_ascii_alphanumeric())
            && l.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let ok = match rule {
        NameRule::Dns1123Label => label(name),
        NameRule::Dns1123Subdomain => name.len() <= 253 && name.split('.').all(label),
    };
    (!ok).then(|| {
        let what = match rule {
            NameRule::Dns1123Label => {
                "a DNS-1123 label (at most 63 characters: a-z, 0-9 and '-', starting and ending with a letter or digit)"
            }
            NameRule::Dns1123Subdomain => {
                "a DNS-1123 subdomain (at most 253 characters: dot-separated labels of a-z, 0-9 and '-')"
            }
        };
        format!("{name:?} is not {what}")
    })
}

fn check_name(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    namespaced: bool,
    rule: NameRule,
) -> Result<(), String> {
    let name = meta.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err("metadata.name is required".into());
    }
    if let Some(why) = name_problem(name, rule) {
        return Err(format!("metadata.name: {why}"));
    }
    if namespaced && meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".into());
    }
    if let Some(why) =
        meta.namespace.as_deref().filter(|_| namespaced).and_then(|ns| name_problem(ns, NameRule::Dns1123Label))
    {
        return Err(format!("metadata.namespace: {why}"));
    }
    if !namespaced {
        meta.namespace = None;
    }
    Ok(())
}

fn check_port_name(what: &str, name: Option<&str>) -> Result<(), String> {
    match name.filter(|n| !n.is_empty()).and_then(|n| name_problem(n, NameRule::Dns1123Label)) {
        Some(why) => Err(format!("{what}: {why}")),
        None => Ok(()),
    }
}

fn check_port(what: &str, port: i32, allow_zero: bool) -> Result<(), String> {
    let low = if allow_zero { 0 } else { 1 };
    if !(low..=65535).contains(&port) {
        return Err(format!("{what}: {port} is not a valid port number"));
    }
    Ok(())
}

fn check_protocol(what: &str, protocol: Option<&str>) -> Result<(), String> {
    match protocol {
        None | Some("TCP" | "UDP" | "SCTP") => Ok(()),
        Some(other) => Err(format!("{what}: unsupported protocol {other:?} (want TCP, UDP or SCTP)")),
    }
}

/// Why the API server refuses `ip` as an endpoint or an external IP
/// (ValidateEndpointIP, ValidateNonSpecialIP), if it does: a Service's
/// traffic must not be sent to nowhere (unspecified), to the node itself
/// (loopback), to what only the node should reach (link-local: a cloud's
/// metadata server at 169.254.169.254) or to a group (multicast).
fn special(ip: IpAddr) -> Option<&'static str> {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    if ip.is_unspecified() {
        Some("may not be unspecified (0.0.0.0, ::)")
    } else if ip.is_loopback() {
        Some("may not be in the loopback range (127.0.0.0/8, ::1/128)")
    } else if link_local {
        Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
    } else if ip.is_multicast() {
        Some("may not be multicast (224.0.0.0/4, ff00::/8)")
    } else {
        None
    }
}

/// The API server's rules for `spec.clusterIPs` (left out, it is
/// `[clusterIP]`, as the API server defaults it): empty when `clusterIP`
/// is, beginning with `clusterIP` otherwise, `"None"` only alone, and at
/// most one address per IP family. Each address was read already.
fn check_cluster_ips(cluster_ip: &str, cluster_ips: &[String]) -> Result<(), String> {
    let Some(first) = cluster_ips.first() else { return Ok(()) };
    if cluster_ip.is_empty() {
        return Err("spec.clusterIPs: must be empty when spec.clusterIP is not set".into());
    }
    if first != cluster_ip {
        return Err(format!("spec.clusterIPs[0]: {first:?} must equal spec.clusterIP {cluster_ip:?}"));
    }
    if first == "None" && cluster_ips.len() > 1 {
        return Err("spec.clusterIPs: \"None\" must be the only value".into());
    }
    if cluster_ips.len() > 2 {
        return Err(format!("spec.clusterIPs: {} addresses, at most 2 (one per IP family)", cluster_ips.len()));
    }
    if let [a, b] = cluster_ips {
        let family = |i: usize, ip: &str| {
            sloppy(ip)
                .map(|ip| if ip.is_ipv6() { "IPv6" } else { "IPv4" })
                .ok_or_else(|| format!("spec.clusterIPs[{i}]: {ip:?} is not an IP address"))
        };
        let (fa, fb) = (family(0, a)?, family(1, b)?);
        if fa == fb {
            return Err(format!("spec.clusterIPs: {a:?} and {b:?} are both {fa}: at most one address per IP family"));
        }
    }
    Ok(())
}

fn check_service(mut svc: Service) -> Result<Service, String> {
    check_name(&mut svc.metadata, true, NameRule::Dns1123Label)?;
    let spec = svc.spec.as_ref().ok_or("spec is required")?;
    let ips = spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter());
    for ip in ips {
        // Old objects' leading zeros read as Kubernetes' ParseIPSloppy.
        if !(ip.is_empty() || ip == "None" || sloppy(ip).is_some()) {
            return Err(format!("spec.clusterIP: {ip:?} is not an IP address"));
        }
    }
    check_cluster_ips(spec.cluster_ip.as_deref().unwrap_or(""), spec.cluster_ips.as_deref().unwrap_or_default())?;
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        let parsed = sloppy(ip).ok_or_else(|| format!("spec.externalIPs[{i}]: {ip:?} is not an IP address"))?;
        if let Some(why) = special(parsed) {
            return Err(format!("spec.externalIPs[{i}]: {ip:?} {why}"));
        }
    }
    // A range that cannot be read would leave the load balancer open to
    // every source (the API server refuses them too).
    for (i, r) in spec.load_balancer_source_ranges.iter().flatten().enumerate() {
        kpx_rules::model::Cidr::parse_sloppy(r)
            .map_err(|_| format!("spec.loadBalancerSourceRanges[{i}]: {r:?} is not a CIDR"))?;
    }
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
    for (i, ip) in ingress.into_iter().flatten().enumerate().filter_map(|(i, g)| Some((i, g.ip.as_ref()?))) {
        sloppy(ip).ok_or_else(|| format!("status.loadBalancer.ingress[{i}].ip: {ip:?} is not an IP address"))?;
    }
    check_port("spec.healthCheckNodePort", spec.health_check_node_port.unwrap_or(0), true)?;
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        check_port(&format!("spec.ports[{i}].port"), p.port, false)?;
        check_port(&format!("spec.ports[{i}].nodePort"), p.node_port.unwrap_or(0), true)?;
        check_protocol(&format!("spec.ports[{i}].protocol"), p.protocol.as_deref())?;
        check_port_name(&format!("spec.ports[{i}].name"), p.name.as_deref())?;
        let name = p.name.clone().unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            return Err(format!("spec.ports[{i}].name is required when a Service has several ports"));
        }
        if !names.insert(name.clone()) {
            return Err(format!("spec.ports[{i}].name {name:?} is used twice"));
        }
    }
    Ok(svc)
}

fn check_slice(mut slice: EndpointSlice) -> Result<EndpointSlice, String> {
    check_name(&mut slice.metadata, true, NameRule::Dns1123Subdomain)?;
    let has_service =
        slice.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).is_some_and(|s| !s.is_empty());
    if !has_service {
        return Err("metadata.labels[\"kubernetes.io/service-name\"] is required".into());
    }
    let want_v6 = match slice.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        "FQDN" => None,
        other => return Err(format!("addressType: {other:?} is not IPv4, IPv6 or FQDN")),
    };
    // `endpoints` may be left out (optional since v1.36, kubernetes/kubernetes#136111).
    for (i, ep) in slice.endpoints.iter().flatten().enumerate() {
        if ep.addresses.is_empty() {
            return Err(format!("endpoints[{i}].addresses must not be empty"));
        }
        if let Some(want_v6) = want_v6 {
            for a in &ep.addresses {
                let ip = sloppy(a).ok_or_else(|| format!("endpoints[{i}].addresses: {a:?} is not an IP address"))?;
                if ip.is_ipv6() != want_v6 {
                    return Err(format!(
                        "endpoints[{i}].addresses: {a:?} does not match addressType {}",
                        slice.address_type
                    ));
                }
                if let Some(why) = special(ip) {
                    return Err(format!("endpoints[{i}].addresses: {a:?} {why}"));
                }
            }
        }
    }
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Some(port) = p.port {
            check_port(&format!("ports[{i}].port"), port, false)?;
        }
        check_protocol(&format!("ports[{i}].protocol"), p.protocol.as_deref())?;
        check_port_name(&format!("ports[{i}].name"), p.name.as_deref())?;
    }
    Ok(slice)
}

fn check_node(mut node: Node) -> Result<Node, String> {
    check_name(&mut node.metadata, false, NameRule::Dns1123Subdomain)?;
    Ok(node)
}

fn check_service_cidr(mut cidr: ServiceCIDR) -> Result<ServiceCIDR, String> {
    check_name(&mut cidr.metadata, false, NameRule::Dns1123Subdomain)?;
    for (i, c) in cidr.spec.iter().flat_map(|s| s.cidrs.iter().flatten()).enumerate() {
        kpx_rules::model::Cidr::parse_sloppy(c).map_err(|e| format!("spec.cidrs[{i}]: {e}"))?;
    }
    Ok(cidr)
}
