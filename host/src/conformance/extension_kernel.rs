//! An extension's real-traffic flows (`kpx conformance EXT.wasm --kernel`):
//! a few of the conformance cases, each in its own network namespaces with
//! kpx running the mode's built-in backend and the extension (configured
//! as `kit`, its parameters and its Services' annotations as given), so
//! that the extension's rules reach the kernel through the writers kpx
//! runs on a node. Real TCP connections go to every Service destination of
//! the case's flows, from each flow's own client and from extra clients:
//! one inside each source prefix the extension's rules name, one outside
//! them all. Each connection's outcome (answered by an endpoint, refused,
//! dropped) must be what the extension's own rules say: the first of its
//! rules that matches, per Service port and attachment in path order
//! (firewall, before dispatch, then after kube-proxy's DNAT, `service`),
//! ends it; a connection no rule ends gets kube-proxy's outcome, which the
//! tracer reads from the built-in backend's rules for that source. Then
//! every counter the rules name must have counted the connections its
//! rules matched, as kpx's /metrics has it.
//!
//! A connection that a rate-limited rule might find over its rate is not
//! sent (a token bucket refills in time): the flows stay within each
//! bucket's burst, where the rule does not match.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use kpx_netlab::routed::{GATEWAY_V4, GATEWAY_V6};
use kpx_netlab::{Lab, Ns, Reply, Request};
use kpx_rules::model::{Cidr, Cluster, IpFamily, Node, Protocol, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::extension::{Action, Attachment, Rule, Ruleset};
use kpx_rules::trace::{self, Ending, Packet};

use super::cases::{Case, CaseNode, Flow};
use super::extension::NAME;
use super::kernel::{self, CaseLab, NODE_LISTENER, SINK_LISTENER};
use super::tracer::{Inputs, Walk, inputs, render, walker};
use super::{Report, Row};
use crate::extension::layout::{self, Destination, Layout, Test};
use crate::runtime::{self, BackendPlugin, ExtensionPlugin, Runtime, objects};
use crate::state::PortMap;

/// The modes an extension runs in (and `--kernel` checks by default).
pub const MODES: [ProxyMode; 2] = [ProxyMode::Iptables, ProxyMode::Nftables];

/// The cases whose Services the flows use: cluster IPs with and without
/// endpoints, node ports (on every address, and on --nodeport-addresses,
/// the only node ports the `service` attachment can tell apart), external
/// IPs, load balancers with source ranges (the `firewall` attachment),
/// and both families.
pub const CASES: [&str; 6] = [
    "01-clusterip.yaml",
    "07-nodeport.yaml",
    "08-nodeport-addresses.yaml",
    "12-external-ips.yaml",
    "15-load-balancer.yaml",
    "20-dual-stack.yaml",
];

/// Connections per destination and source: a second one shows the first
/// left nothing behind (a conntrack entry, a token taken).
const CONNECTIONS: usize = 2;
/// How long the counters may take to reach /metrics past kpx's first read
/// after the last connection.
const COUNTER_WAIT: Duration = Duration::from_secs(6);
/// Where kpx serves /metrics in the node's namespace (its default).
const METRICS: &str = "127.0.0.1:10249";
/// The row of failures that stop every case.
const KERNEL_ROW: &str = "extension flows (kernel)";
/// A connection's path through the attachments.
const PATH: [Attachment; 3] = [Attachment::Firewall, Attachment::BeforeDispatch, Attachment::Service];
/// Addresses tried for the client outside every source the rules name.
const OUTSIDERS: [&str; 6] =
    ["198.51.100.77", "203.0.113.77", "100.64.77.77", "fd77::77", "2001:db8:77::77", "fc00:77::77"];
/// Offsets into a source prefix tried for a client inside it (its own
/// first address last).
const INSIDE: [u32; 7] = [77, 7, 1, 2, 10, 100, 0];
/// Clients inside the rules' prefixes per family: a few show the rules
/// match; each more is another round of connections.
const MAX_INSIDERS: usize = 2;

/// What the flows run, and with what.
pub struct Setup<'a> {
    /// The extension, loaded: its rules give each connection's expected
    /// outcome.
    pub plugin: &'a ExtensionPlugin,
    /// Its file, which kpx loads (`--extension kit=FILE,...`).
    pub file: &'a Path,
    /// Its parameters (`--extension-param`): the expectations' and kpx's.
    pub parameters: &'a [(String, String)],
    /// Given to kpx in place of `parameters` (None: the same): a test's way
    /// to make the kernel disagree with the expectations, which must fail.
    pub run_parameters: Option<&'a [(String, String)]>,
    /// Every Service's annotations, keys without `ext.kpx.dev/kit.`.
    pub annotations: &'a [(String, String)],
    /// The kpx binary each case runs.
    pub kpx: &'a Path,
    /// Where kpx caches compiled components (None: a directory for this
    /// run, removed after it).
    pub cache: Option<&'a Path>,
}

/// What a client sees of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered by one of these servers: endpoints (`ip:port`), or the
    /// listener behind a destination kube-proxy leaves untouched.
    Answered(BTreeSet<String>),
    /// Refused: a TCP reset, or an ICMP error.
    Refused,
    /// No answer: dropped.
    Dropped,
}

impl Outcome {
    /// Whether `reply` is this outcome.
    pub fn admits(&self, reply: &Reply) -> bool {
        match (self, reply) {
            (Outcome::Answered(servers), Reply::Answer { server, .. }) => servers.contains(server),
            (Outcome::Refused, Reply::Refused) | (Outcome::Dropped, Reply::Timeout) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Answered(servers) if servers.len() == 1 => {
                write!(f, "answered by {}", servers.iter().next().expect("one server"))
            }
            Outcome::Answered(servers) => {
                let names: Vec<&str> = servers.iter().map(String::as_str).collect();
                write!(f, "answered by one of {}", names.join(", "))
            }
            Outcome::Refused => f.write_str("refused"),
            Outcome::Dropped => f.write_str("dropped (no answer)"),
        }
    }
}

/// kube-proxy's part of a connection's path: what becomes of it when no
/// rule of the extension ends it first, and whether kube-proxy
/// destination-NATs it (only then does the `service` attachment see it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kube {
    pub outcome: Outcome,
    pub dnat: bool,
}

/// The extension's rules applied to one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub outcome: Outcome,
    /// What decided it: a rule of the extension, or kube-proxy.
    pub because: String,
    /// The rules (positions in the ruleset) that match it and name a counter.
    pub counted: Vec<usize>,
    /// Rules that may or may not see (and count) it: before-dispatch rules
    /// for a connection kube-proxy drops, which nftables mode may drop
    /// before them (a load balancer's unlisted source) and iptables mode
    /// drops after them.
    pub maybe_counted: Vec<usize>,
    /// The rate-limited rules it passes within their rate: each takes a
    /// token from its rule's bucket.
    pub tokens: Vec<usize>,
}

/// Why a connection's outcome cannot be told beforehand: it is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unforeseeable {
    /// A rate-limited rule's bucket may be empty by now (it refills in
    /// time, so past the burst the rule may or may not match).
    #[error(
        "rule {rule} may find it over its rate ({per_second} a second, bursts of {burst}; {used} connections went through it before): not sent"
    )]
    OverRate { rule: usize, per_second: u32, burst: u32, used: u32 },
}

/// The extension's verdict on a connection from `source` that meets its
/// rules at `stops` (attachment and service port key; in any order, taken
/// in path order); `kube` is kube-proxy's part; `used`: per rate-limited
/// rule (its position), the connections that went through it within its
/// rate so far.
pub fn expect(
    ruleset: &Ruleset,
    stops: &[(Attachment, &str)],
    source: IpAddr,
    kube: &Kube,
    used: &BTreeMap<usize, u32>,
) -> Result<Expected, Unforeseeable> {
    let mut out = Expected {
        outcome: kube.outcome.clone(),
        because: "no rule of the extension ends it: kube-proxy's outcome".into(),
        counted: Vec::new(),
        maybe_counted: Vec::new(),
        tokens: Vec::new(),
    };
    for attachment in PATH {
        let Some(&(_, service)) = stops.iter().find(|(a, _)| *a == attachment) else { continue };
        // After DNAT only: a connection kube-proxy refuses, drops or leaves
        // alone never gets there.
        if attachment == Attachment::Service && !kube.dnat {
            continue;
        }
        let uncertain = attachment == Attachment::BeforeDispatch && kube.outcome == Outcome::Dropped;
        let mut counted = Vec::new();
        let end = pass(ruleset, attachment, service, source, used, &mut counted, &mut out.tokens)?;
        if uncertain {
            out.maybe_counted.extend(counted);
        } else {
            out.counted.extend(counted);
        }
        if let Some((outcome, rule)) = end {
            out.outcome = outcome;
            out.because = format!("rule {} of the extension: {}", rule + 1, describe(&ruleset.rules[rule]));
            return Ok(out);
        }
    }
    Ok(out)
}

/// One port's rules at one attachment, in order, for a connection from
/// `source`: the end a rule gives it, with that rule's position, or None
/// when it goes on. Matching rules that name a counter go to `counted`,
/// rate-limited rules it passes within their rate to `tokens`.
fn pass(
    ruleset: &Ruleset,
    attachment: Attachment,
    service: &str,
    source: IpAddr,
    used: &BTreeMap<usize, u32>,
    counted: &mut Vec<usize>,
    tokens: &mut Vec<usize>,
) -> Result<Option<(Outcome, usize)>, Unforeseeable> {
    let rules = ruleset.rules.iter().enumerate().filter(|(_, r)| r.attachment == attachment && r.service == service);
    for (i, rule) in rules {
        if rule.source.is_some_and(|s| s.cidr.contains(&source) == s.negate) {
            continue;
        }
        if let Some(rate) = rule.over_rate {
            let before = used.get(&i).copied().unwrap_or(0);
            if before >= rate.burst {
                return Err(Unforeseeable::OverRate {
                    rule: i + 1,
                    per_second: rate.per_second,
                    burst: rate.burst,
                    used: before,
                });
            }
            // Within its rate the rule does not match; it takes a token.
            tokens.push(i);
            continue;
        }
        if rule.counter.is_some() {
            counted.push(i);
        }
        match rule.action {
            Action::Continue => {}
            Action::Drop => return Ok(Some((Outcome::Dropped, i))),
            Action::Reject => return Ok(Some((Outcome::Refused, i))),
            // It ends this extension's rules at this attachment, and the
            // connection goes on (to the next attachment, and kube-proxy's
            // rules).
            Action::Accept => return Ok(None),
        }
    }
    Ok(None)
}

/// A rule as a failure names it.
fn describe(rule: &Rule) -> String {
    let action = format!("{:?}", rule.action).to_lowercase();
    let mut out = format!("{action} at {} of {}", rule.attachment.name(), rule.service);
    if let Some(s) = rule.source {
        out.push_str(&format!(", from {}{}", if s.negate { "outside " } else { "" }, s.cidr));
    }
    if let Some(c) = &rule.counter {
        out.push_str(&format!(", counted as {c}"));
    }
    out
}

/// What a counter must show: at least `must`, at most `must + may` (a SYN
/// sent again after no quick answer meets the rules again; a rule kube-proxy
/// may drop before).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub must: u64,
    pub may: u64,
}

impl Tally {
    pub fn admits(self, n: u64) -> bool {
        (self.must..=self.must + self.may).contains(&n)
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.may {
            0 => write!(f, "{}", self.must),
            may => write!(f, "{} to {}", self.must, self.must + may),
        }
    }
}

/// The real-traffic flows of every case of [`CASES`] in each of `modes`.
pub fn check(report: &mut Report, runtime: &Runtime, setup: &Setup, modes: &[ProxyMode]) {
    check_cases(report, runtime, setup, modes, &CASES);
}

/// [`check`] on the named cases only.
pub fn check_cases(report: &mut Report, runtime: &Runtime, setup: &Setup, modes: &[ProxyMode], names: &[&str]) {
    if let Err(e) = Lab::new() {
        report.row(KERNEL_ROW).fail(format!("cannot build network namespaces: {e}"));
        return;
    }
    let flag = match extension_flag(setup) {
        Ok(flag) => flag,
        Err(e) => return report.row(KERNEL_ROW).fail(e),
    };
    // Without a cache every case's kpx would compile the components again.
    let (cache, scratch) = match setup.cache {
        Some(dir) => (dir.to_path_buf(), None),
        None => match crate::scratch::fresh_dir("conformance-extension-cache") {
            Ok((dir, _)) => (dir.clone(), Some(dir)),
            Err(e) => return report.row(KERNEL_ROW).fail(e),
        },
    };
    let extra = ["--extension".to_string(), flag, "--plugin-cache-dir".to_string(), cache.display().to_string()];
    let cases: Vec<Case> = Case::all().into_iter().filter(|c| names.contains(&c.label())).collect();
    for name in names.iter().filter(|n| !cases.iter().any(|c| c.label() == **n)) {
        report.row(KERNEL_ROW).fail(format!("no conformance case is named {name}"));
    }
    for mode in modes {
        match load_backend(runtime, *mode) {
            Ok(backend) => cases.iter().for_each(|case| run_case(report, setup, &backend, case, *mode, &extra)),
            Err(e) => report.row(KERNEL_ROW).fail(e),
        }
    }
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// kpx's `--extension kit=FILE,key=value...`, which separates parameters
/// with commas: one holding a comma cannot be given.
fn extension_flag(setup: &Setup) -> Result<String, String> {
    let file = std::path::absolute(setup.file).map_err(|e| format!("{}: {e}", setup.file.display()))?;
    let mut flag = format!("{NAME}={}", file.display());
    if flag.contains(',') {
        return Err(format!("{}: kpx's --extension flag cannot name a file whose path holds a comma", file.display()));
    }
    for (k, v) in setup.run_parameters.unwrap_or(setup.parameters) {
        if k.contains(',') || v.contains(',') {
            return Err(format!(
                "--extension-param {k}={v}: kpx's --extension flag separates parameters with commas, so the real-traffic flows cannot give it one that holds a comma"
            ));
        }
        flag.push_str(&format!(",{k}={v}"));
    }
    Ok(flag)
}

/// The mode's built-in backend, which the tracer reads kube-proxy's
/// outcomes from (kpx runs the same one).
fn load_backend(runtime: &Runtime, mode: ProxyMode) -> Result<BackendPlugin, String> {
    let bytes = runtime::builtin::get(mode.as_str()).ok_or_else(|| format!("kpx has no built-in {mode} backend"))?;
    runtime.load_backend(mode.as_str(), bytes).map_err(|e| format!("the built-in {mode} backend: {e}"))
}

/// The row of a case's connections in one mode and family.
fn flows_row(mode: ProxyMode, family: IpFamily, label: &str) -> String {
    format!("extension flows (kernel, {mode}, {family}): {label}")
}

/// The row of a case's counters in one mode (a counter's series adds
/// both families' counts).
fn counters_row(mode: ProxyMode, label: &str) -> String {
    format!("extension counters (kernel, {mode}): {label}")
}

/// Whether the case has TCP flows of `family` (the only ones sent).
fn has_tcp(case: &Case, family: IpFamily) -> bool {
    case.flows.iter().any(|f| f.family() == family && f.protocol() == Protocol::Tcp)
}

/// The case's node, flags and text, with other manifests and flows.
fn like(case: &Case, manifests: String, flows: Vec<Flow>) -> Case {
    Case {
        name: case.name.clone(),
        about: case.about.clone(),
        flags: case.flags.clone(),
        node: CaseNode {
            name: case.node.name.clone(),
            addresses: case.node.addresses.clone(),
            pod_cidrs: case.node.pod_cidrs.clone(),
            labels: case.node.labels.clone(),
        },
        manifests,
        flows,
    }
}

/// What every family of one case shares.
struct CaseCtx<'a> {
    setup: &'a Setup<'a>,
    backend: &'a BackendPlugin,
    mode: ProxyMode,
    /// The case as it ships (its flows).
    case: &'a Case,
    /// The case with its Services annotated (its state).
    annotated: &'a Case,
    /// The annotations, full keys.
    annotations: &'a [(String, String)],
    /// Addresses the lab uses: no extra client may take one.
    taken: BTreeSet<IpAddr>,
    endpoints: BTreeSet<IpAddr>,
}

/// One connection to send (each [`CONNECTIONS`] times).
struct Probe {
    /// A case's flow, from its own source or another; its `expect` is
    /// kube-proxy's outcome (the lab puts a listener behind a destination
    /// kube-proxy leaves alone or drops, as for the case's own flows).
    flow: Flow,
    /// The Service port it is for, as failures name it.
    service: String,
    /// Where it meets the extension's rules: attachment and port key.
    stops: Vec<(Attachment, String)>,
    kube: Result<Kube, String>,
}

/// One family of a case: the extension's rules and the connections.
struct Plan {
    family: IpFamily,
    ruleset: Ruleset,
    probes: Vec<Probe>,
    /// The case's flows not sent, with the reason.
    skips: Vec<String>,
    /// What the host left out of the rules.
    notes: Vec<String>,
    /// (service port, counter) of every counter the rules name.
    counters: BTreeSet<(String, String)>,
}

/// One case in one mode: its connections in the kernel, a row per family,
/// and its counters.
fn run_case(
    report: &mut Report,
    setup: &Setup,
    backend: &BackendPlugin,
    case: &Case,
    mode: ProxyMode,
    extra: &[String],
) {
    let label = case.label().trim_end_matches(".yaml");
    let families: Vec<IpFamily> = [IpFamily::V4, IpFamily::V6].into_iter().filter(|f| has_tcp(case, *f)).collect();
    let fail_all = |report: &mut Report, why: &str| {
        for family in &families {
            report.row(&flows_row(mode, *family, label)).fail(why.to_string());
        }
    };
    let prefix = runtime::extension::annotation_prefix(NAME);
    let annotations: Vec<(String, String)> =
        setup.annotations.iter().map(|(k, v)| (format!("{prefix}{k}"), v.clone())).collect();
    let annotated = match annotate(&case.manifests, &annotations) {
        Ok(manifests) => like(case, manifests, Vec::new()),
        Err(e) => return fail_all(report, &format!("annotating the case's Services: {e}")),
    };
    let ctx = CaseCtx {
        setup,
        backend,
        mode,
        case,
        annotated: &annotated,
        annotations: &annotations,
        taken: taken(case),
        endpoints: kernel::endpoint_addresses(case).into_iter().map(|(ip, _)| ip).collect(),
    };
    let mut plans = Vec::new();
    for family in &families {
        match plan(&ctx, *family) {
            Ok(Some(p)) => plans.push(p),
            Ok(None) => {}
            Err(e) => report.row(&flows_row(mode, *family, label)).fail(e),
        }
    }
    let flows: Vec<Flow> = plans.iter().flat_map(|p| p.probes.iter().map(|x| x.flow.clone())).collect();
    if flows.is_empty() {
        for p in &plans {
            let row = report.row(&flows_row(mode, p.family, label));
            p.skips.iter().for_each(|s| row.skip(s.clone()));
        }
        return;
    }
    let lab_case = like(case, annotated.manifests.clone(), flows);
    let lab = match kernel::build(&lab_case, mode.as_str()) {
        Ok(lab) => lab,
        Err(e) => return fail_all(report, &format!("building the namespaces: {e}")),
    };
    let scratch = format!("conformance-extension-{mode}-{label}");
    let ran = kernel::with_kpx(&lab_case, &lab, &scratch, setup.kpx, mode.as_str(), extra, |log| {
        send_all(report, &lab_case, &lab, &plans, mode, label, log)
    });
    if let Err(e) = ran {
        fail_all(report, &e);
    }
}

/// One family's rules, kube-proxy's outcomes and the connections to send;
/// None when the case has no TCP flow of the family.
fn plan(ctx: &CaseCtx, family: IpFamily) -> Result<Option<Plan>, String> {
    if !has_tcp(ctx.case, family) {
        return Ok(None);
    }
    let Inputs { settings, node, cluster, ports } = inputs(ctx.annotated, ctx.mode, family, &[])?;
    check_annotated(&ports, ctx.annotations)?;
    let by_key = crate::state::port_map(&ports);
    let ruleset = rules(ctx.setup.plugin, ctx.setup.parameters, &settings, &node, &cluster, &by_key)?;
    // As kpx does with them: refused whole, or some ports' rules left out.
    let skipped = crate::validate::extension::check(ctx.setup.plugin.name(), family, &ruleset, &by_key)
        .map_err(|e| format!("the host refuses the extension's rules: {e}"))?;
    let notes = skipped.iter().map(|(port, why)| format!("the host leaves out the rules for {port}: {why}")).collect();
    let layout = layout::build(NAME, &settings, &ruleset, &by_key, &skipped);
    let rendered = render(ctx.backend, ctx.annotated, ctx.mode, family, &[])
        .map_err(|e| format!("the built-in {} backend: {e}", ctx.mode))?;
    let walk =
        walker(&rendered, ctx.annotated)?.ok_or_else(|| format!("the tracer does not walk {} rules", ctx.mode))?;
    let sources = probe_sources(&ruleset, family, &ctx.taken);
    let mut skips = Vec::new();
    let probes = variants(ctx.case, family, &sources, &ctx.endpoints, &mut skips)
        .into_iter()
        .map(|flow| probe(ctx, &layout, &rendered.ports, &walk, flow))
        .collect();
    let counters = layout.counters.values().map(|c| (c.service.clone(), c.name.clone())).collect();
    Ok(Some(Plan { family, ruleset, probes, skips, notes, counters }))
}

/// A fresh instance's rules for the state, fed as kpx feeds it (ports in
/// key order).
fn rules(
    plugin: &ExtensionPlugin,
    parameters: &[(String, String)],
    settings: &Settings,
    node: &Node,
    cluster: &Cluster,
    ports: &PortMap,
) -> Result<Ruleset, String> {
    let fail = |e: runtime::Error| format!("the extension: {e}");
    let mut instance = plugin.instantiate(NAME, settings, parameters).map_err(fail)?;
    instance.reset(node, cluster, crate::state::ports_in(ports)).map_err(fail)?;
    instance.render(objects(crate::state::ports_in(ports))).map_err(fail)
}

/// Every port carries every annotation (full keys): the manifests were
/// annotated as the state reads them.
fn check_annotated(ports: &[ServicePort], annotations: &[(String, String)]) -> Result<(), String> {
    for port in ports {
        if let Some((k, v)) = annotations.iter().find(|a| !port.annotations.contains(a)) {
            return Err(format!("{} did not get the annotation {k}={v} from the case's manifests", port.key));
        }
    }
    Ok(())
}

/// The case's manifests with `annotations` (full keys) on every Service.
/// The shipped cases write each Service's metadata as one flow mapping on
/// one line (`metadata: {name: ..., namespace: ...}`), which gets them; a
/// Service written otherwise is an error (the unit tests annotate every
/// case).
pub fn annotate(manifests: &str, annotations: &[(String, String)]) -> Result<String, String> {
    if annotations.is_empty() {
        return Ok(manifests.to_string());
    }
    // Keys and values as JSON strings: YAML reads them as they are.
    let quote = |t: &str| serde_json::to_string(t).expect("a string");
    let entries: Vec<String> = annotations.iter().map(|(k, v)| format!("{}: {}", quote(k), quote(v))).collect();
    let entries = entries.join(", ");
    let lines: Vec<&str> = manifests.lines().collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut start = 0;
    for end in (0..=lines.len()).filter(|&i| i == lines.len() || lines[i].trim_end() == "---") {
        out.extend(annotate_document(&lines[start..end], &entries)?);
        if let Some(marker) = lines.get(end) {
            out.push(marker.to_string());
        }
        start = end + 1;
    }
    Ok(out.join("\n") + "\n")
}

/// One document's lines, its metadata annotated if it is a Service.
fn annotate_document(lines: &[&str], entries: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    if !lines.iter().any(|l| l.trim_end() == "kind: Service") {
        return Ok(out);
    }
    let (at, inner) = lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| Some((i, l.trim_end().strip_prefix("metadata: {")?.strip_suffix('}')?)))
        .ok_or("a Service's metadata is not one `metadata: {...}` line")?;
    out[at] = match inner.split_once("annotations: {") {
        Some((before, after)) => format!("metadata: {{{before}annotations: {{{entries}, {after}}}"),
        None => format!("metadata: {{{inner}, annotations: {{{entries}}}}}"),
    };
    Ok(out)
}

/// Addresses in use in a case's lab (its node's, its flows' sources and
/// destinations, its Services' and endpoints', the sink's and the
/// gateways'): no extra client may take one.
fn taken(case: &Case) -> BTreeSet<IpAddr> {
    let mut out: BTreeSet<IpAddr> = case.node.addresses.iter().copied().collect();
    for flow in &case.flows {
        out.insert(flow.from);
        out.insert(flow.destination().0);
    }
    out.extend(kernel::endpoint_addresses(case).into_iter().map(|(ip, _)| ip));
    if let Ok(state) = case.state() {
        for family in [IpFamily::V4, IpFamily::V6] {
            for port in case.service_ports(&state, family) {
                out.extend(port.addresses().copied());
            }
        }
    }
    let fixed = [kernel::SINK_ADDRESSES[0], kernel::SINK_ADDRESSES[1], GATEWAY_V4, GATEWAY_V6];
    out.extend(fixed.iter().filter_map(|a| a.parse::<IpAddr>().ok()));
    out
}

/// The extra clients of a family: one inside each of (up to
/// [`MAX_INSIDERS`] of) the source prefixes the rules name, and one
/// outside them all, none of them `taken`.
pub fn probe_sources(ruleset: &Ruleset, family: IpFamily, taken: &BTreeSet<IpAddr>) -> Vec<IpAddr> {
    let cidrs: BTreeSet<Cidr> =
        ruleset.rules.iter().filter_map(|r| r.source).map(|s| s.cidr).filter(|c| c.family() == family).collect();
    let free = |ip: &IpAddr| IpFamily::of(ip) == family && usable(ip) && !taken.contains(ip);
    let mut out: Vec<IpAddr> = Vec::new();
    for cidr in &cidrs {
        if out.len() >= MAX_INSIDERS {
            break;
        }
        let inside = INSIDE
            .iter()
            .filter_map(|k| offset(cidr.network(), *k))
            .find(|ip| cidr.contains(ip) && free(ip) && !out.contains(ip));
        out.extend(inside);
    }
    let outsider = OUTSIDERS
        .iter()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| free(ip) && !cidrs.iter().any(|c| c.contains(ip)));
    out.extend(outsider);
    out
}

/// `ip` plus `k`, if that is still an address.
fn offset(ip: IpAddr, k: u32) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v4) => u32::from(v4).checked_add(k).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(v6) => u128::from(v6).checked_add(u128::from(k)).map(|n| IpAddr::V6(n.into())),
    }
}

/// Whether a client may send from `ip` (a unicast address, not loopback or
/// link-local).
fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let first = v4.octets()[0];
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || first == 0
                || first >= 224)
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some())
        }
    }
}

/// The connections of one family of a case: its TCP flows that real
/// packets can make, each from its own source and, where it starts at an
/// ordinary client (not the node, an endpoint or a named interface), from
/// each of `sources`; one per destination and source. Flows left out go
/// to `skips` with the reason.
fn variants(
    case: &Case,
    family: IpFamily,
    sources: &[IpAddr],
    endpoints: &BTreeSet<IpAddr>,
    skips: &mut Vec<String>,
) -> Vec<Flow> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for flow in case.flows.iter().filter(|f| f.family() == family && f.protocol() == Protocol::Tcp) {
        if let Some(why) = kernel::kernel_skip(case, flow) {
            skips.push(format!("{}: not sent ({why})", flow.name));
            continue;
        }
        let ordinary = !flow.from_node(case) && flow.iface.is_none() && !endpoints.contains(&flow.from);
        let extra = sources.iter().filter(|_| ordinary);
        for from in std::iter::once(&flow.from).chain(extra) {
            if !seen.insert((flow.to.clone(), *from)) {
                continue;
            }
            let mut variant = flow.clone();
            if *from != flow.from {
                variant.name = format!("{} (from {from})", flow.name);
                variant.from = *from;
            }
            out.push(variant);
        }
    }
    out
}

/// A connection's plan: kube-proxy's outcome from the tracer, where it
/// meets the extension's rules from the host's layout.
fn probe(ctx: &CaseCtx, layout: &Layout, ports: &[ServicePort], walk: &Walk, mut flow: Flow) -> Probe {
    let (dst, dport) = flow.destination();
    let local = |ip: &IpAddr| ip.is_loopback() || ctx.case.node.addresses.contains(ip);
    let listener = if local(&dst) { NODE_LISTENER } else { SINK_LISTENER };
    let packet = Packet {
        src: flow.from,
        dst,
        dport,
        protocol: Protocol::Tcp,
        from_node: flow.from_node(ctx.case),
        in_interface: flow.iface.clone(),
    };
    let traced = walk(&packet).map_err(|e| format!("the tracer: {e}"));
    let kube = traced.as_ref().map_err(String::clone).and_then(|t| kube_part(&t.verdict, listener));
    flow.expect = match &traced {
        Ok(t) => t.verdict.to_string(),
        Err(_) => flow.expected(ctx.mode.as_str()).to_string(),
    };
    flow.expect_nftables = None;
    flow.expect_ipvs = None;
    flow.expect_userspace = None;
    let stops =
        PATH.iter().filter_map(|a| arrival(layout, *a, dst, dport, &local).map(|s| (*a, s.to_string()))).collect();
    let service = service_of(ports, dst, dport, &local);
    Probe { flow, service, stops, kube }
}

/// kube-proxy's part from the tracer's verdict; `listener` answers at a
/// destination it leaves untouched.
fn kube_part(verdict: &trace::Verdict, listener: &str) -> Result<Kube, String> {
    let endpoints: BTreeSet<String> = verdict
        .endings
        .iter()
        .filter_map(|e| match e {
            Ending::Endpoint(ep) => Some(ep.clone()),
            _ => None,
        })
        .collect();
    if !endpoints.is_empty() && endpoints.len() == verdict.endings.len() {
        return Ok(Kube { outcome: Outcome::Answered(endpoints), dnat: true });
    }
    let endings: Vec<&Ending> = verdict.endings.iter().collect();
    let outcome = match endings.as_slice() {
        [Ending::Drop] => Outcome::Dropped,
        [Ending::Reject] => Outcome::Refused,
        [Ending::Accept] => Outcome::Answered(BTreeSet::from([listener.to_string()])),
        _ => return Err(format!("kube-proxy's rules give it more than one outcome ({verdict}): not sent")),
    };
    Ok(Kube { outcome, dnat: false })
}

/// The service port key of the port chain a TCP connection to `dst`:`dport`
/// enters at `attachment`, as the host's layout writes the entries: the
/// first entry whose tests the destination passes (another Service's
/// address on a node port's number returns before the node-port entries).
/// `local`: whether an address is the node's.
fn arrival<'a>(
    layout: &'a Layout,
    attachment: Attachment,
    dst: IpAddr,
    dport: u16,
    local: &dyn Fn(&IpAddr) -> bool,
) -> Option<&'a str> {
    let mut exempted = false;
    for e in layout.entries.get(&attachment)? {
        if !exempted && matches!(e.destination, Destination::NodePort { .. }) {
            exempted = true;
            if layout.exempt.get(&attachment).is_some_and(|x| x.contains(&(dst, Protocol::Tcp, dport))) {
                return None;
            }
        }
        if e.protocol != Protocol::Tcp || e.port != dport {
            continue;
        }
        if e.tests(attachment).iter().any(|tests| tests.iter().all(|t| passes(t, dst, local))) {
            return layout.chains.get(&e.chain).map(|c| c.service.as_str());
        }
    }
    None
}

/// Whether a connection to `dst` passes one test of an entry (after DNAT
/// its original destination is `dst`).
fn passes(test: &Test, dst: IpAddr, local: &dyn Fn(&IpAddr) -> bool) -> bool {
    match *test {
        Test::Destination { negate, cidr } => cidr.contains(&dst) != negate,
        Test::Local => local(&dst),
        Test::OriginalDestination(cidr) => cidr.contains(&dst),
    }
}

/// The key of the TCP Service port a connection is for, as failures name it.
fn service_of(ports: &[ServicePort], dst: IpAddr, dport: u16, local: &dyn Fn(&IpAddr) -> bool) -> String {
    ports
        .iter()
        .find(|p| {
            p.protocol == Protocol::Tcp
                && ((p.port == dport && p.addresses().any(|a| *a == dst))
                    || (p.node_port != 0 && p.node_port == dport && local(&dst)))
        })
        .map_or_else(|| "no Service port".to_string(), |p| p.key.clone())
}

/// With kpx running: every connection of every family, then the counters.
fn send_all(report: &mut Report, case: &Case, lab: &CaseLab, plans: &[Plan], mode: ProxyMode, label: &str, log: &Path) {
    let mut tallies: BTreeMap<(String, String), Tally> =
        plans.iter().flat_map(|p| p.counters.iter().cloned()).map(|k| (k, Tally::default())).collect();
    for plan in plans {
        let row = report.row(&flows_row(mode, plan.family, label));
        plan.skips.iter().for_each(|s| row.skip(s.clone()));
        plan.notes.iter().for_each(|n| row.note(n.clone()));
        let mut used = BTreeMap::new();
        for probe in &plan.probes {
            for _ in 0..CONNECTIONS {
                connection(row, case, lab, plan, probe, &mut used, &mut tallies);
            }
        }
        // A sync in which kpx refused the extension's rules (or it failed).
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let family = format!("family={}", plan.family);
        let ours = format!("extension=\"{NAME}\"");
        for line in text.lines().filter(|l| l.contains("extension failed") && l.contains(&ours) && l.contains(&family))
        {
            row.fail(format!("kpx: {}", line.trim().chars().take(400).collect::<String>()));
        }
    }
    if !tallies.is_empty() {
        counters(report.row(&counters_row(mode, label)), lab, &tallies);
    }
}

/// One connection: its expected outcome, what it got, and what its rules
/// count.
fn connection(
    row: &mut Row,
    case: &Case,
    lab: &CaseLab,
    plan: &Plan,
    probe: &Probe,
    used: &mut BTreeMap<usize, u32>,
    tallies: &mut BTreeMap<(String, String), Tally>,
) {
    let flow = &probe.flow;
    let kube = match &probe.kube {
        Ok(kube) => kube,
        Err(why) => return row.skip(format!("{}: {why}", flow.name)),
    };
    let stops: Vec<(Attachment, &str)> = probe.stops.iter().map(|(a, s)| (*a, s.as_str())).collect();
    let expected = match expect(&plan.ruleset, &stops, flow.from, kube, used) {
        Ok(expected) => expected,
        Err(why) => return row.skip(format!("{}: {why}", flow.name)),
    };
    let reply = send(case, lab, flow, &expected.outcome);
    // A SYN without a quick answer (an ICMP error the kernel rate-limits,
    // IPv6's first refusal) may be sent again and meet the rules again.
    let again = u32::from(!matches!(reply, Reply::Answer { .. }));
    for i in &expected.tokens {
        *used.entry(*i).or_default() += 1 + again;
    }
    let counter = |i: &usize| {
        let rule = &plan.ruleset.rules[*i];
        rule.counter.clone().map(|c| (rule.service.clone(), c))
    };
    for key in expected.counted.iter().filter_map(counter) {
        let tally = tallies.entry(key).or_default();
        tally.must += 1;
        tally.may += u64::from(again);
    }
    for key in expected.maybe_counted.iter().filter_map(counter) {
        tallies.entry(key).or_default().may += 1 + u64::from(again);
    }
    row.record(if expected.outcome.admits(&reply) {
        Ok(())
    } else {
        Err(format!(
            "{}: {} -> {} ({}): want {} ({}), saw {}",
            flow.name,
            flow.from,
            flow.to,
            probe.service,
            expected.outcome,
            expected.because,
            seen(&reply)
        ))
    });
}

/// One TCP connection of `flow`, waiting as long as `want` needs.
fn send(case: &Case, lab: &CaseLab, flow: &Flow, want: &Outcome) -> Reply {
    let (ns, from) = lab.origin(case, flow);
    let (dst, port) = flow.destination();
    let timeout = if *want == Outcome::Refused { kernel::REJECT_TIMEOUT } else { kernel::TIMEOUT };
    Request { to: SocketAddr::new(dst, port), from, timeout }.tcp(ns)
}

/// A reply as a failure names it.
fn seen(reply: &Reply) -> String {
    match reply {
        Reply::Answer { server, .. } => format!("answered by {server}"),
        Reply::Refused => "refused".into(),
        Reply::Timeout => "no answer".into(),
        Reply::Error(e) => format!("an error: {e}"),
    }
}

/// Each counter's count against what its rules matched: a check each.
fn counters(row: &mut Row, lab: &CaseLab, tallies: &BTreeMap<(String, String), Tally>) {
    let seen = match read_counts(lab.node(), tallies) {
        Ok(seen) => seen,
        Err(e) => return row.fail(e),
    };
    let keys: BTreeSet<&(String, String)> = tallies.keys().chain(seen.keys()).collect();
    for key in keys {
        let (service, counter) = key;
        let want = tallies.get(key).copied().unwrap_or_default();
        let n = seen.get(key).copied().unwrap_or(0);
        row.record(if want.admits(n) {
            Ok(())
        } else {
            Err(format!("counter {counter} of {service}: counted {n}, want {want} (the connections its rules matched)"))
        });
    }
}

/// The extension's counts from kpx's /metrics once every counter reached
/// what it must (or [`COUNTER_WAIT`] passed): kpx reads the kernel's
/// counts every 2 s, so the first look comes after one such read.
fn read_counts(
    node: &Ns,
    tallies: &BTreeMap<(String, String), Tally>,
) -> Result<BTreeMap<(String, String), u64>, String> {
    std::thread::sleep(crate::sync::EXTENSION_COUNTER_INTERVAL + Duration::from_millis(500));
    let deadline = Instant::now() + COUNTER_WAIT;
    loop {
        let seen = counts(&metrics(node)?);
        let reached = tallies.iter().all(|(k, t)| seen.get(k).copied().unwrap_or(0) >= t.must);
        if reached || Instant::now() >= deadline {
            return Ok(seen);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// kpx's /metrics, read inside the node's namespace.
fn metrics(node: &Ns) -> Result<String, String> {
    let read = node.enter(|| -> std::io::Result<String> {
        use std::io::{Read, Write};
        let to: SocketAddr = METRICS.parse().expect("an address");
        let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: kit\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    });
    match read {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(format!("cannot read kpx's /metrics: {e}")),
        Err(e) => Err(format!("cannot enter the node's namespace: {e}")),
    }
}

/// The kit's `kpx_extension_counter_total` series: (service, counter) to
/// count.
fn counts(metrics: &str) -> BTreeMap<(String, String), u64> {
    metrics
        .lines()
        .filter_map(|l| {
            let (labels, value) = l.strip_prefix("kpx_extension_counter_total{")?.split_once("} ")?;
            if label(labels, "extension")? != NAME {
                return None;
            }
            let n = value.split_whitespace().next()?.parse::<u64>().ok()?;
            Some(((label(labels, "service")?.to_string(), label(labels, "counter")?.to_string()), n))
        })
        .collect()
}

/// A label's value in `key="value",...`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.split(',').find_map(|part| part.strip_prefix(key)?.strip_prefix("=\""))?;
    start.strip_suffix('"')
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::extension::{Rate, SourceMatch};

    const WEB: &str = "ns/web:http";

    fn rule(attachment: Attachment, source: Option<&str>, action: Action, counter: Option<&str>) -> Rule {
        let source = source.map(|s| match s.strip_prefix('!') {
            Some(c) => SourceMatch { negate: true, cidr: c.parse().unwrap() },
            None => SourceMatch { negate: false, cidr: s.parse().unwrap() },
        });
        Rule { attachment, service: WEB.into(), source, over_rate: None, counter: counter.map(str::to_string), action }
    }

    fn answered() -> Kube {
        Kube { outcome: Outcome::Answered(BTreeSet::from(["10.180.0.1:80".to_string()])), dnat: true }
    }

    const EVERYWHERE: [(Attachment, &str); 3] =
        [(Attachment::Firewall, WEB), (Attachment::BeforeDispatch, WEB), (Attachment::Service, WEB)];

    /// (outcome, counted, maybe counted) of a connection from `source`.
    fn verdict(
        rules: &[Rule],
        stops: &[(Attachment, &str)],
        source: &str,
        kube: &Kube,
    ) -> (Outcome, Vec<usize>, Vec<usize>) {
        let got = expect(&Ruleset { rules: rules.to_vec() }, stops, source.parse().unwrap(), kube, &BTreeMap::new());
        let got = got.unwrap();
        (got.outcome, got.counted, got.maybe_counted)
    }

    /// The first matching rule per port and attachment, in path order,
    /// ends a connection; continue goes on; what no rule ends is
    /// kube-proxy's; a rule's counter counts what it matches.
    #[test]
    fn the_first_matching_rule_in_path_order_decides() {
        use Attachment::{BeforeDispatch, Firewall, Service};
        let all = &EVERYWHERE[..];
        let through = || (answered().outcome, Vec::new(), Vec::new());
        assert_eq!(verdict(&[], all, "192.0.2.77", &answered()), through());

        let documentation = [rule(Service, Some("192.0.2.0/24"), Action::Reject, Some("rejected"))];
        assert_eq!(verdict(&documentation, all, "192.0.2.77", &answered()), (Outcome::Refused, vec![0], vec![]));
        assert_eq!(verdict(&documentation, all, "198.51.100.77", &answered()), through());
        // kube-proxy refuses it, without DNAT: the service rules never see it.
        let refused = Kube { outcome: Outcome::Refused, dnat: false };
        assert_eq!(verdict(&documentation, all, "192.0.2.77", &refused), (Outcome::Refused, vec![], vec![]));

        let deny_outside = [
            rule(BeforeDispatch, None, Action::Continue, Some("seen")),
            rule(BeforeDispatch, Some("!10.0.0.0/8"), Action::Drop, Some("denied")),
        ];
        assert_eq!(verdict(&deny_outside, all, "10.1.2.3", &answered()), (answered().outcome, vec![0], vec![]));
        assert_eq!(verdict(&deny_outside, all, "203.0.113.1", &answered()), (Outcome::Dropped, vec![0, 1], vec![]));
        // kube-proxy drops it, maybe before the dispatch rules (nftables).
        let dropped = Kube { outcome: Outcome::Dropped, dnat: false };
        assert_eq!(verdict(&deny_outside, all, "10.1.2.3", &dropped), (Outcome::Dropped, vec![], vec![0]));

        let firewall_first = [
            rule(BeforeDispatch, None, Action::Continue, Some("seen")),
            rule(Firewall, Some("203.0.113.0/24"), Action::Drop, None),
        ];
        assert_eq!(verdict(&firewall_first, all, "203.0.113.1", &answered()), (Outcome::Dropped, vec![], vec![]));
        assert_eq!(verdict(&firewall_first, all, "198.51.100.1", &answered()), (answered().outcome, vec![0], vec![]));
        // Not a load balancer's address: no firewall stop.
        let not_lb = &EVERYWHERE[1..];
        assert_eq!(verdict(&firewall_first, not_lb, "203.0.113.1", &answered()), (answered().outcome, vec![0], vec![]));

        // Another port's rules are not this connection's.
        let mut other = rule(BeforeDispatch, None, Action::Drop, None);
        other.service = "ns/other:http".into();
        assert_eq!(verdict(&[other], all, "203.0.113.1", &answered()), through());
    }

    /// Within its burst a rate-limited rule does not match (each
    /// connection takes a token); past it the outcome is unforeseeable.
    #[test]
    fn a_rate_limited_rule_is_passed_within_its_burst_and_not_foreseen_past_it() {
        let mut limited = rule(Attachment::BeforeDispatch, None, Action::Drop, Some("over"));
        limited.over_rate = Some(Rate { per_second: 1, burst: 2 });
        let rules = Ruleset { rules: vec![limited] };
        let source = "203.0.113.1".parse().unwrap();
        let got = expect(&rules, &EVERYWHERE, source, &answered(), &BTreeMap::from([(0, 1)])).unwrap();
        assert_eq!((got.outcome, got.tokens, got.counted), (answered().outcome, vec![0], vec![]));
        let err = expect(&rules, &EVERYWHERE, source, &answered(), &BTreeMap::from([(0, 2)])).unwrap_err();
        assert_eq!(err, Unforeseeable::OverRate { rule: 1, per_second: 1, burst: 2, used: 2 });
    }

    #[test]
    fn extra_clients_are_inside_each_prefix_and_outside_all() {
        let rules = Ruleset { rules: vec![rule(Attachment::Service, Some("192.0.2.0/24"), Action::Reject, None)] };
        let taken = BTreeSet::from(["198.51.100.77".parse().unwrap()]);
        let v4: Vec<IpAddr> = ["192.0.2.77", "203.0.113.77"].map(|a| a.parse().unwrap()).to_vec();
        assert_eq!(probe_sources(&rules, IpFamily::V4, &taken), v4);
        let everything = Ruleset { rules: vec![rule(Attachment::Service, Some("0.0.0.0/0"), Action::Reject, None)] };
        assert!(
            probe_sources(&everything, IpFamily::V4, &BTreeSet::new()).is_empty(),
            "nothing usable inside 0.0.0.0/0 at those offsets, nothing outside"
        );
        let host = Ruleset { rules: vec![rule(Attachment::Service, Some("203.0.113.9/32"), Action::Reject, None)] };
        assert_eq!(probe_sources(&host, IpFamily::V4, &BTreeSet::new())[0], "203.0.113.9".parse::<IpAddr>().unwrap());
        let v6 = probe_sources(&Ruleset::default(), IpFamily::V6, &BTreeSet::new());
        assert_eq!(v6, vec!["fd77::77".parse::<IpAddr>().unwrap()]);
    }

    /// Every shipped case's Services take the annotations (the text edit
    /// the kernel flows rely on), read back through the state.
    #[test]
    fn every_case_is_annotated_on_every_service() {
        let annotations = [("ext.kpx.dev/kit.allow".to_string(), "10.0.0.0/8, 192.0.2.1".to_string())];
        for case in Case::all() {
            let manifests = annotate(&case.manifests, &annotations).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
            let annotated = like(&case, manifests, Vec::new());
            let state = annotated.state().unwrap();
            for family in [IpFamily::V4, IpFamily::V6] {
                let ports = annotated.service_ports(&state, family);
                check_annotated(&ports, &annotations).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
            }
            assert_eq!(annotate(&case.manifests, &[]).unwrap(), case.manifests);
        }
    }

    #[test]
    fn the_cases_are_shipped_and_have_tcp_flows() {
        let all = Case::all();
        for name in CASES {
            let case = all.iter().find(|c| c.label() == name).unwrap_or_else(|| panic!("no case {name}"));
            assert!(has_tcp(case, IpFamily::V4), "{name}");
        }
        assert!(CASES.iter().any(|n| all.iter().any(|c| c.label() == *n && has_tcp(c, IpFamily::V6))));
    }

    #[test]
    fn counters_are_read_from_the_metrics_text() {
        let text = "# TYPE kpx_extension_counter counter\n\
                    kpx_extension_counter_total{extension=\"kit\",service=\"ns1/one:p80\",counter=\"rejected\"} 3\n\
                    kpx_extension_counter_total{extension=\"other\",service=\"ns1/one:p80\",counter=\"x\"} 9\n";
        assert_eq!(counts(text), BTreeMap::from([(("ns1/one:p80".to_string(), "rejected".to_string()), 3)]));
        let tally = Tally { must: 3, may: 1 };
        assert!(tally.admits(3) && tally.admits(4) && !tally.admits(2) && !tally.admits(5));
        assert_eq!(tally.to_string(), "3 to 4");
    }
}
