//! The measurements. Stages are timed in-process with the functions the
//! daemon runs, in its order: the source's parser, the state, the WASM
//! plugin (render, and its output copied into the host), the host's
//! confinement check, the host's rendering (iptables-restore text, or
//! nf_tables netlink messages) and the kernel write (iptables-restore, or
//! the netlink batch) into a fresh network namespace. Memory and latency
//! run the real kpx binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser as _;
use kpx::kernel::iptables::{IptablesKernel, dialect, frame::frame as ipt_frame, render::payload};
use kpx::kernel::netlink::nfnl::Batch;
use kpx::kernel::nftables::{NftablesKernel, encode::add_table, frame::frame as nft_frame, messages, sizing};
use kpx::runtime::{Limits, Runtime, builtin};
use kpx::source::Event;
use kpx::source::manifests::parse_documents;
use kpx::state::{ServiceName, State};
use kpx::validate::Scope;
use kpx_rules::backend::Backend;
use kpx_rules::iptables::IptablesProxier;
use kpx_rules::model::{Change, Cluster, IpFamily, Node, ProxyMode, ServicePort, Settings};
use kpx_rules::nftables::NftablesProxier;
use kpx_rules::ops::Ruleset;
use kpx_rules::ops::nftables::{SetDecl, SetRef};
use serde_json::json;

use crate::args::Args;
use crate::cluster::{self, NODE};
use crate::daemon::{self, DaemonRun};
use crate::netns::{Netns, NetnsExec};

/// The largest size upstream's nftables shape is loaded for as the
/// reference (about 1 s at 1k x 10 and 18-22 s at 3k here, at e9f2b6b;
/// the time grows faster than the chain count).
const UPSTREAM_MAX: usize = 3000;
const PROBE: &str = "10.111.255.10:80";

/// Runs of each in-process stage; the median is reported (this machine's
/// run-to-run noise is larger than most differences worth seeing).
const REPS: usize = 5;

/// The daemon's default cap on what one sync writes.
const MAX_BYTES: usize = kpx::kernel::DEFAULT_MAX_BYTES;

/// The run with the median time, and that time.
fn median<T>(mut runs: Vec<(Duration, T)>) -> (Duration, T) {
    runs.sort_by_key(|(d, _)| *d);
    let mid = runs.len() / 2;
    let (d, t) = runs.swap_remove(mid);
    (d, t)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[derive(Debug, Default, Clone)]
pub struct Stages {
    /// Reading the objects (YAML parsing; an API source gets them parsed).
    pub source: Duration,
    /// State and change tracking: objects merged into service ports.
    pub host: Duration,
    /// The WASM plugin, its typed output copied into the host included.
    pub plugin: Duration,
    pub native: Duration,
    /// The host's confinement check.
    pub validate: Duration,
    /// The host's rendering: iptables-restore text or netlink messages.
    pub render: Duration,
    pub kernel: Duration,
    pub bytes: usize,
}

impl Stages {
    /// WASM against native up to the kernel payload: the host's rendering
    /// of the typed rules added on both sides, which is what the ratio
    /// covered when plugins returned kernel text (up to 77e411a).
    fn to_payload_ratio(&self) -> f64 {
        (self.plugin + self.render).as_secs_f64() / (self.native + self.render).as_secs_f64().max(1e-9)
    }

    /// Each stage's median over several runs.
    fn median(runs: &[Stages]) -> Stages {
        let m = |f: fn(&Stages) -> Duration| {
            let mut v: Vec<Duration> = runs.iter().map(f).collect();
            v.sort();
            v[v.len() / 2]
        };
        let mut bytes: Vec<usize> = runs.iter().map(|s| s.bytes).collect();
        bytes.sort();
        Stages {
            source: m(|s| s.source),
            host: m(|s| s.host),
            plugin: m(|s| s.plugin),
            native: m(|s| s.native),
            validate: m(|s| s.validate),
            render: m(|s| s.render),
            kernel: m(|s| s.kernel),
            bytes: bytes[bytes.len() / 2],
        }
    }

    /// kpx's own share: everything but the kernel.
    pub fn own(&self) -> Duration {
        self.host + self.plugin + self.validate + self.render
    }
    pub fn total(&self) -> Duration {
        self.own() + self.kernel
    }
}

#[derive(Debug, Clone)]
pub struct SizeResult {
    pub mode: String,
    pub services: usize,
    pub endpoints: usize,
    pub full: Stages,
    pub partial: Stages,
    pub chains: usize,
    /// The daemon's own runs, one per source.
    pub daemon: Vec<DaemonRun>,
    /// nftables mode up to [`UPSTREAM_MAX`] Services: upstream's ruleset
    /// shape loaded with `nft -f` (time, chains), the reference.
    pub upstream: Option<(Duration, usize)>,
}

#[derive(Debug, Clone)]
pub struct Latency {
    pub mode: String,
    pub services: usize,
    pub median_us: f64,
    pub p90_us: f64,
}

pub struct Report {
    pub machine: String,
    pub commit: String,
    pub date: String,
    pub sizes: Vec<SizeResult>,
    pub latency: Vec<Latency>,
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn config(mode: &str) -> Result<kpx::config::Config> {
    let args = [
        "kpx",
        "--manifests",
        "/dev/null",
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        "10.128.0.0/9",
        "--proxy-mode",
        mode,
    ];
    Ok(kpx::config::Flags::try_parse_from(args)?.validate()?)
}

enum Native {
    Iptables(IptablesProxier),
    Nftables(NftablesProxier),
}

impl Native {
    fn new(mode: ProxyMode, settings: Settings) -> Native {
        match mode {
            ProxyMode::Iptables | ProxyMode::Userspace => Native::Iptables(IptablesProxier::new(settings)),
            ProxyMode::Nftables | ProxyMode::Ipvs => Native::Nftables(NftablesProxier::new(settings)),
        }
    }
    fn backend(&mut self) -> &mut dyn Backend {
        match self {
            Native::Iptables(p) => p,
            Native::Nftables(p) => p,
        }
    }
}

/// What the host writes for a ruleset, and the write itself.
enum Written {
    Iptables(String),
    Nftables(Batch),
}

impl Written {
    fn bytes(&self) -> usize {
        match self {
            Written::Iptables(t) => t.len(),
            Written::Nftables(m) => m.bytes(),
        }
    }
}

/// The host's check of a ruleset (the daemon's validator).
fn validate(
    settings: &Settings,
    ruleset: &Ruleset,
    scope: &Scope,
    models: &mut Models,
    full: bool,
) -> Result<Duration> {
    let t = Instant::now();
    match ruleset {
        Ruleset::Iptables(rs) => {
            let ctx = kpx::validate::iptables::Context {
                plugin: "bench",
                dialect: dialect(settings),
                scope,
                model: &models.iptables,
                full,
            };
            let checked = kpx::validate::iptables::check(&ctx, rs)?;
            let took = t.elapsed();
            models.iptables.commit(checked);
            Ok(took)
        }
        Ruleset::Nftables(tx) => {
            let ctx = kpx::validate::nftables::Context {
                plugin: "bench",
                family: settings.family,
                scope,
                model: &models.nftables,
                full,
            };
            let checked = kpx::validate::nftables::check(&ctx, tx)?;
            let took = t.elapsed();
            models.nftables.commit(checked);
            Ok(took)
        }
        Ruleset::Ipvs(_) => anyhow::bail!("the benchmark measures the iptables and nftables modes"),
    }
}

#[derive(Default, Clone)]
struct Models {
    iptables: kpx::validate::iptables::Model,
    nftables: kpx::validate::nftables::Model,
    /// Own set declarations written so far (nftables elements are read by them).
    sets: BTreeMap<String, SetDecl>,
    /// iptables: what the host's chains hold after the last write (a
    /// partial sync edits them, as the daemon does).
    host_chains: Option<kpx::kernel::iptables::render::HostChains>,
    /// nftables: each set's elements and the sized sets' sizes.
    counts: sizing::Counts,
    sizes: std::collections::HashMap<String, u32>,
}

/// The host's rendering of a ruleset, with its frame on a full sync.
fn render(settings: &Settings, ruleset: &Ruleset, models: &mut Models, full: bool) -> Result<(Written, Duration)> {
    let t = Instant::now();
    let written = match ruleset {
        Ruleset::Ipvs(_) => anyhow::bail!("the benchmark measures the iptables and nftables modes"),
        Ruleset::Iptables(rs) => {
            let previous = if full { None } else { models.host_chains.as_ref() };
            let (text, host) = payload(&ipt_frame(settings), rs, &[], dialect(settings), previous);
            models.host_chains = Some(host);
            Written::Iptables(text)
        }
        Ruleset::Nftables(tx) => {
            for op in &tx.ops {
                if let kpx_rules::ops::nftables::Op::AddSet(d) = op {
                    models.sets.insert(d.name.clone(), d.clone());
                }
            }
            let sets = &models.sets;
            let decls = |s: &SetRef| match s {
                SetRef::Host(h) => Some(h.declaration()),
                SetRef::Own(n) => sets.get(n).cloned(),
            };
            let mark = settings.masquerade_mark();
            // Sets sized as the daemon sizes them (a partial sync here
            // only adds to sets a full one declared).
            let frame = if full { nft_frame(settings, &Cluster::default()) } else { Vec::new() };
            if full {
                models.counts = sizing::Counts::default();
            }
            models.counts.begin();
            models.counts.apply(settings.family, &frame, &decls);
            models.counts.apply(settings.family, &tx.ops, &decls);
            if full {
                let declared = frame.iter().chain(&tx.ops).filter_map(|op| match op {
                    kpx_rules::ops::nftables::Op::AddSet(d) => Some(d),
                    _ => None,
                });
                models.sizes = sizing::full_sizes(declared, &models.counts, &Default::default());
            }
            let mut out = Batch::new();
            let hints = kpx::kernel::nftables::typeof_udata::hints(&tx.ops);
            let sets = kpx::kernel::nftables::Sets { decls: &decls, sizes: &models.sizes, hints: &hints };
            if full {
                out.push(add_table());
                messages(&mut out, settings.family, mark, &frame, &sets, MAX_BYTES).map_err(anyhow::Error::msg)?;
            }
            messages(&mut out, settings.family, mark, &tx.ops, &sets, MAX_BYTES).map_err(anyhow::Error::msg)?;
            Written::Nftables(out)
        }
    };
    Ok((written, t.elapsed()))
}

/// The kernel write, as the daemon does it, into the namespace.
fn apply(ns: &Netns, written: Written) -> Result<Duration> {
    match written {
        Written::Iptables(text) => {
            let kernel = IptablesKernel::new(IpFamily::V4, Box::new(NetnsExec(ns.0.clone())));
            let t = Instant::now();
            kernel.apply(&text)?;
            Ok(t.elapsed())
        }
        Written::Nftables(mut msgs) => ns.ns().enter(move || -> Result<Duration> {
            let mut kernel = NftablesKernel::new(IpFamily::V4);
            // The socket is opened outside the timing, as the daemon keeps it.
            kernel.objects()?;
            let t = Instant::now();
            kernel.apply(&mut msgs)?;
            Ok(t.elapsed())
        })?,
    }
}

/// The synthetic manifests, parsed as the manifest source does.
fn parse(text: &str) -> Result<Vec<kpx::source::Object>> {
    let (objects, errors) = parse_documents(text);
    if let Some(e) = errors.first() {
        bail!("synthetic manifests rejected: {e}");
    }
    Ok(objects)
}

/// The objects merged into the state (synced), and every IPv4 service port.
fn state_of(objects: Vec<kpx::source::Object>) -> (State, Vec<ServicePort>) {
    let mut state = State::new(NODE);
    for o in objects {
        state.apply(Event::Apply(o));
    }
    state.apply(Event::Synced);
    let names: Vec<ServiceName> = state.service_names().cloned().collect();
    let ports = names.iter().flat_map(|n| state.service_ports(IpFamily::V4, n)).collect();
    (state, ports)
}

/// The bench node and the mode's IPv4 settings, as the daemon derives them.
fn node_settings(mode: &str) -> Result<(Node, Settings)> {
    let config = config(mode)?;
    let node = Node { name: NODE.into(), addresses: vec!["192.168.0.2".parse()?], ..Default::default() };
    let settings = kpx::settings::settings_for(&config, IpFamily::V4, &node, &node.addresses);
    Ok((node, settings))
}

fn measure_size(args: &Args, mode: &str, services: usize, endpoints: usize, dir: &Path) -> Result<SizeResult> {
    eprintln!("== {mode} {services} services x {endpoints} endpoints");
    let text = cluster::manifests(services, endpoints, None);
    let proxy_mode: ProxyMode = mode.parse().map_err(anyhow::Error::msg)?;
    if matches!(proxy_mode, ProxyMode::Ipvs | ProxyMode::Userspace) {
        anyhow::bail!("the benchmark measures the iptables and nftables modes (this kernel has no IPVS)");
    }

    // Source: the manifests parsed into objects.
    let t = Instant::now();
    let objects = parse(&text)?;
    let source_full = t.elapsed();
    // Host: objects merged into the state, every service port computed.
    let t = Instant::now();
    let (mut state, ports) = state_of(objects);
    let mut scope = Scope::default();
    for p in &ports {
        scope.count(IpFamily::V4, p, true);
    }
    let host_full = t.elapsed();
    let _ = state.take_changes();

    let (node, settings) = node_settings(mode)?;
    let objects_count: usize = ports.iter().map(|p| 1 + p.endpoints.len()).sum();

    // Plugin (WASM): the whole state across the boundary, a full render,
    // its typed output copied into the host; a fresh instance each time,
    // as at the daemon's start.
    let runtime = Runtime::new(Limits::default(), Some(dir.join("plugin-cache")))?;
    let plugin = runtime.load_backend(mode, builtin::get(mode).context("no built-in plugin")?)?;
    let mut runs = Vec::new();
    for _ in 0..REPS {
        let mut instance = plugin.instantiate(&settings)?;
        let t = Instant::now();
        instance.reset(&node, &Cluster::default(), &ports)?;
        let ruleset = instance.render(true, objects_count)?;
        runs.push((t.elapsed(), (instance, ruleset)));
    }
    let (plugin_full, (mut instance, ruleset)) = median(runs);

    // The same generator, compiled natively.
    let mut runs = Vec::new();
    for _ in 0..REPS {
        let mut native = Native::new(proxy_mode, settings.clone());
        let input = ports.clone();
        let t = Instant::now();
        native.backend().reset(node.clone(), Cluster::default(), input);
        let native_ruleset = native.backend().render(true).map_err(anyhow::Error::msg)?;
        runs.push((t.elapsed(), (native, native_ruleset)));
    }
    let (native_full, (mut native, native_ruleset)) = median(runs);
    if native_ruleset != ruleset {
        bail!("the WASM and native renders differ");
    }

    let mut runs = Vec::new();
    for _ in 0..REPS {
        let mut models = Models::default();
        let took = validate(&settings, &ruleset, &scope, &mut models, true)?;
        runs.push((took, models));
    }
    let (validate_full, mut models) = median(runs);
    let mut runs = Vec::new();
    for _ in 0..REPS {
        let mut m = models.clone();
        let (written, took) = render(&settings, &ruleset, &mut m, true)?;
        runs.push((took, (written, m)));
    }
    let (render_full, (written, rendered_models)) = median(runs);
    models = rendered_models;
    let bytes_full = written.bytes();
    let chains = match &ruleset {
        Ruleset::Ipvs(_) => 0,
        Ruleset::Iptables(rs) => rs.chains.len() + ipt_frame(&settings).chains.len(),
        Ruleset::Nftables(tx) => {
            let own = tx.ops.iter().filter(|o| matches!(o, kpx_rules::ops::nftables::Op::AddChain(_))).count();
            let host = nft_frame(&settings, &Cluster::default())
                .iter()
                .filter(|o| {
                    matches!(
                        o,
                        kpx_rules::ops::nftables::Op::AddChain(_) | kpx_rules::ops::nftables::Op::AddBaseChain(_)
                    )
                })
                .count();
            own + host
        }
    };
    let ns = Netns::new(&format!("{mode}-{services}"))?;
    let kernel_full = apply(&ns, written)?;
    let full = Stages {
        source: source_full,
        host: host_full,
        plugin: plugin_full,
        native: native_full,
        validate: validate_full,
        render: render_full,
        kernel: kernel_full,
        bytes: bytes_full,
    };

    // One endpoint added to one Service: seen by the state, to programmed.
    // Done for REPS different Services, one after the other; each stage's
    // median is reported.
    let mut partials = Vec::new();
    for rep in 0..REPS {
        let i = services / 2 + rep;
        let slice = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n{}",
            (0..=endpoints).map(|j| format!("- addresses: [{}]\n", cluster::endpoint_ip(i, j))).collect::<String>()
        );
        let (mut slice_objects, _) = parse_documents(&slice);
        scope.forget_removed();
        let t = Instant::now();
        state.apply(Event::Apply(slice_objects.remove(0)));
        let changed = state.take_changes();
        let new_ports: Vec<ServicePort> =
            changed.services.keys().flat_map(|n| state.service_ports(IpFamily::V4, n)).collect();
        for p in &new_ports {
            if let Some(old) = ports.iter().find(|o| o.key == p.key) {
                scope.count(IpFamily::V4, old, false);
            }
            scope.count(IpFamily::V4, p, true);
        }
        let changes: Vec<Change> = new_ports.into_iter().map(Change::Upsert).collect();
        let host_partial = t.elapsed();
        let t = Instant::now();
        instance.apply(&changes)?;
        let partial_ruleset = instance.render(false, objects_count)?;
        let plugin_partial = t.elapsed();
        let t = Instant::now();
        native.backend().apply(changes.clone());
        let native_partial_ruleset = native.backend().render(false);
        let native_partial = t.elapsed();
        drop(native_partial_ruleset);
        let validate_partial = validate(&settings, &partial_ruleset, &scope, &mut models, false)?;
        let (written, render_partial) = render(&settings, &partial_ruleset, &mut models, false)?;
        let bytes_partial = written.bytes();
        let kernel_partial = apply(&ns, written)?;
        partials.push(Stages {
            source: Duration::ZERO,
            host: host_partial,
            plugin: plugin_partial,
            native: native_partial,
            validate: validate_partial,
            render: render_partial,
            kernel: kernel_partial,
            bytes: bytes_partial,
        });
    }
    drop(ns);
    let partial = Stages::median(&partials);

    // The daemon itself, from each source: its first sync and one-endpoint
    // changes, as it logs them, and its peak memory.
    let mut daemons = Vec::new();
    for &source in &args.sources {
        eprintln!("   the daemon, from {}: first sync, {} changes", source.name(), args.changes);
        match daemon::run(args, mode, services, &text, dir, source) {
            Ok(run) => daemons.push(run),
            Err(e) => eprintln!("   daemon run ({}) failed: {e:#}", source.name()),
        }
    }
    // Upstream's shape for the same cluster: 118 s at 10k x 10 here, so
    // only up to UPSTREAM_MAX Services.
    let upstream = if proxy_mode == ProxyMode::Nftables && services <= UPSTREAM_MAX {
        eprintln!("   upstream's nftables shape, nft -f");
        // As before the daemon: the last namespace freed first.
        if let Err(e) = crate::quiet::settle(crate::quiet::LIMIT) {
            eprintln!("   cannot read /proc/stat: {e:#}");
        }
        crate::upstream::load(services, endpoints).map_err(|e| eprintln!("   upstream's shape failed: {e:#}")).ok()
    } else {
        None
    };
    Ok(SizeResult { mode: mode.into(), services, endpoints, full, partial, chains, daemon: daemons, upstream })
}

/// First-packet latency through `services` Services: new TCP connections
/// from a client namespace to the last Service.
fn measure_latency(args: &Args, mode: &str, services: usize, dir: &Path) -> Result<Latency> {
    eprintln!("== latency {mode} {services} services");
    let lab = kpx_netlab::node::NodeLab::build(1)?;
    let backend = lab.backends[0].ip.clone();
    let text = cluster::manifests(services, 1, Some(&backend)).replace("10.95.0.10", PROBE.split(':').next().unwrap());
    let mdir = dir.join(format!("latency-{mode}-{services}"));
    let _ = std::fs::remove_dir_all(&mdir);
    std::fs::create_dir_all(&mdir)?;
    std::fs::write(mdir.join("cluster.yaml"), text)?;
    let cache = dir.join("plugin-cache");
    let kpx_args = [
        "--proxy-mode",
        mode,
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        "10.244.0.0/16",
        "--manifests",
        mdir.to_str().unwrap(),
        "--plugin-cache-dir",
        cache.to_str().unwrap(),
    ];
    let mut kpx = lab.start_kpx(&args.kpx, &kpx_args, &dir.join(format!("kpx-latency-{mode}-{services}.log")))?;
    if !kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(900)) {
        bail!("kpx did not sync:\n{}", kpx.log());
    }
    let to: SocketAddr = PROBE.parse()?;
    let req = kpx_netlab::Request { to, from: None, timeout: Duration::from_secs(2) };
    let mut samples = Vec::new();
    match req.tcp(&lab.client) {
        kpx_netlab::Reply::Answer { .. } => {}
        other => bail!("probe request failed: {other:?}"),
    }
    for _ in 0..20 {
        let _ = req.connect_time(&lab.client); // warm-up
    }
    for _ in 0..500 {
        match req.connect_time(&lab.client) {
            Ok(took) => samples.push(took),
            Err(reply) => bail!("probe connect failed: {reply:?}"),
        }
    }
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e6;
    Ok(Latency { mode: mode.into(), services, median_us: pick(0.5), p90_us: pick(0.9) })
}

pub fn run(args: &Args) -> Result<Report> {
    let dir = PathBuf::from("target/bench");
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let mut sizes = Vec::new();
    for (mode, s, e) in &args.sizes {
        sizes.push(measure_size(args, mode, *s, *e, &dir)?);
    }
    let mut latency = Vec::new();
    for (mode, s) in &args.latency {
        latency.push(measure_latency(args, mode, *s, &dir)?);
    }
    let (machine, commit, date) = provenance();
    Ok(Report { machine, commit, date, sizes, latency })
}

/// Where and when a run was taken: (machine, commit, date). The commit
/// is `-dirty` when the work tree differs from it (untracked files too).
pub fn provenance() -> (String, String, String) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let machine = format!(
        "{} x {cpu}, {} MiB, kernel {}, {}, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        output("sh", &["-c", "awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo"]),
        output("uname", &["-r"]),
        output("nft", &["--version"]),
        output("iptables", &["--version"]),
    );
    // Results written by earlier runs of the same build do not make the
    // tree dirty.
    let dirty =
        if output("git", &["status", "--porcelain", "--", ".", ":!bench/results"]).is_empty() { "" } else { "-dirty" };
    (
        machine,
        format!("{}{dirty}", output("git", &["rev-parse", "--short", "HEAD"])),
        output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
    )
}

impl Report {
    pub fn table(&self) -> String {
        let mut out = format!("kpx benchmark — {} — commit {} — {}\n\n", self.machine, self.commit, self.date);
        out.push_str("mode      services x eps | source | full sync: host   plugin  native  wasm/nat  payload  valid.  render  kpx own  kernel   own/kernel | one endpoint added: kpx own  kernel  total | chains  written\n");
        for r in &self.sizes {
            let f = &r.full;
            let p = &r.partial;
            out.push_str(&format!(
                "{:<9} {:>6} x {:<4}  | {:>6.0} | {:>13.1} {:>8.1} {:>7.1} {:>8.2}x {:>7.2}x {:>7.1} {:>7.1} {:>8.1} {:>8.1} {:>9.1}% | {:>24.2} {:>7.2} {:>6.2} | {:>6} {:>8} KiB\n",
                r.mode,
                r.services,
                r.endpoints,
                ms(f.source),
                ms(f.host),
                ms(f.plugin),
                ms(f.native),
                f.plugin.as_secs_f64() / f.native.as_secs_f64().max(1e-9),
                f.to_payload_ratio(),
                ms(f.validate),
                ms(f.render),
                ms(f.own()),
                ms(f.kernel),
                100.0 * f.own().as_secs_f64() / f.kernel.as_secs_f64().max(1e-9),
                ms(p.own()),
                ms(p.kernel),
                ms(p.total()),
                r.chains,
                f.bytes / 1024,
            ));
        }
        out.push_str("(all times in ms; plugin, native, validation and render of a full sync and every stage of the one-endpoint change are medians of 5 runs, the rest one run; \"source\" = YAML parsing of the manifests; \"plugin\" = the WASM render with its typed output copied into the host; \"wasm/nat\" = plugin / native; \"payload\" = the same up to the kernel payload, (plugin + render) / (native + render), what a generator that wrote kernel text itself was compared on; \"kpx own\" = host (state and change tracking) + plugin + validation + render (iptables-restore text or netlink messages); \"kernel\" = the daemon's write of it into an empty namespace: iptables-restore, or one nf_tables netlink batch; \"written\" = payload or netlink bytes)\n");
        if self.sizes.iter().any(|r| !r.daemon.is_empty()) {
            out.push_str(&daemon_table(&self.sizes));
        }
        if self.sizes.iter().any(|r| r.upstream.is_some()) {
            out.push_str(&upstream_table(&self.sizes));
        }
        if !self.latency.is_empty() {
            out.push_str(
                "\nfirst-packet latency (TCP connect to the last Service, through the node: 500 new connections):\n",
            );
            for l in &self.latency {
                out.push_str(&format!(
                    "  {:<9} {:>6} services: median {:>7.0} µs, p90 {:>7.0} µs\n",
                    l.mode, l.services, l.median_us, l.p90_us
                ));
            }
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let stages = |s: &Stages| {
            json!({"source_ms": ms(s.source), "host_ms": ms(s.host), "plugin_ms": ms(s.plugin), "native_ms": ms(s.native), "validate_ms": ms(s.validate), "render_ms": ms(s.render),
                   "kernel_ms": ms(s.kernel), "kpx_own_ms": ms(s.own()), "total_ms": ms(s.total()), "payload_bytes": s.bytes})
        };
        json!({
            "machine": self.machine, "commit": self.commit, "date": self.date,
            "sizes": self.sizes.iter().map(|r| json!({
                "mode": r.mode, "services": r.services, "endpoints": r.endpoints,
                "full": stages(&r.full), "one_endpoint_added": stages(&r.partial),
                "wasm_over_native": r.full.plugin.as_secs_f64() / r.full.native.as_secs_f64().max(1e-9),
                "wasm_over_native_to_payload": r.full.to_payload_ratio(),
                "own_over_kernel": r.full.own().as_secs_f64() / r.full.kernel.as_secs_f64().max(1e-9),
                "chains": r.chains, "daemon": r.daemon.iter().map(DaemonRun::json).collect::<Vec<_>>(),
                "upstream_shape": r.upstream.map(|(took, chains)| json!({
                    "nft_f_ms": ms(took), "chains": chains,
                    "kpx_start_to_first_sync_over_upstream": r.daemon.iter().map(|d| json!({"source": d.source.name(), "ratio": d.to_first_sync.as_secs_f64() / took.as_secs_f64()})).collect::<Vec<_>>(),
                    "kpx_kernel_over_upstream": r.daemon.first().map(|d| json!({"source": d.source.name(), "ratio": d.first.kernel_ms / ms(took)})),
                })),
            })).collect::<Vec<_>>(),
            "first_packet_latency": self.latency.iter().map(|l| json!({
                "mode": l.mode, "services": l.services, "median_us": l.median_us, "p90_us": l.p90_us})).collect::<Vec<_>>(),
        })
    }
}

/// The daemon's own figures, a row per size and source.
fn daemon_table(sizes: &[SizeResult]) -> String {
    let mut out = String::from(
        "\nthrough the daemon (its own log):\nmode      services x eps  source     | start to first sync  own   read  host  plugin  check  kernel  own/kernel | one endpoint added: p50   p99   max  (kpx own  kernel, medians) | peak RSS MiB\n",
    );
    for r in sizes {
        for d in &r.daemon {
            let f = &d.first;
            out.push_str(&format!(
                "{:<9} {:>6} x {:<4}  {:<10} | {:>19.0} {:>5.0} {:>6} {:>5.0} {:>7.0} {:>6.0} {:>7.0} {:>10.0}% | {:>24.2} {:>5.2} {:>5.2}  ({:>7.2} {:>7.2})         | {:>6.0}\n",
                r.mode,
                r.services,
                r.endpoints,
                d.source.name(),
                d.to_first_sync.as_secs_f64() * 1e3,
                d.own_to_first_sync_ms(),
                d.read_ms.map_or("-".into(), |m| format!("{m:.0}")),
                f.host_ms,
                f.plugin_ms,
                f.check_ms,
                f.kernel_ms,
                100.0 * d.own_to_first_sync_ms() / f.kernel_ms.max(1e-9),
                d.change_quantile(0.5),
                d.change_quantile(0.99),
                d.change_quantile(1.0),
                d.change_stage(|s| s.own_ms()),
                d.change_stage(|s| s.kernel_ms),
                d.rss_mib,
            ));
        }
    }
    out.push_str("(ms; kpx started in a fresh namespace with --iptables-min-sync-period 100ms; \"start to first sync\" = from spawning the process to the \"synced rules\" line of its first IPv4 sync, which kpx logs once the kernel's write has returned; \"own\" = that less the kernel's part; \"read\" = the manifest source's first read (file read and parsed); host, plugin, check and kernel are the first sync's stages as the daemon logs them; a change is one EndpointSlice with one endpoint for one Service, made 150 ms after the last sync, timed from the file renamed into the manifest directory or the object stored by the list/watch server to that change's \"synced rules\" line; peak RSS is the daemon's VmHWM at the end of the run)\n");
    out
}

/// kpx against upstream's ruleset shape for the same cluster.
fn upstream_table(sizes: &[SizeResult]) -> String {
    let mut out = String::from(
        "\nagainst upstream's nftables shape (the same cluster as upstream writes it: a chain per service port and per endpoint, loaded with nft -f into a fresh namespace):\n",
    );
    for r in sizes {
        let Some((took, chains)) = r.upstream else { continue };
        let up = ms(took);
        out.push_str(&format!(
            "  {:<9} {:>6} x {:<4} upstream's shape {:>6} chains {:>8.0} ms |",
            r.mode, r.services, r.endpoints, chains, up
        ));
        for d in &r.daemon {
            out.push_str(&format!(
                " kpx from process start to first sync ({}) {:.0} ms = {:.2}x;",
                d.source.name(),
                d.to_first_sync.as_secs_f64() * 1e3,
                d.to_first_sync.as_secs_f64() * 1e3 / up
            ));
        }
        if let Some(d) = r.daemon.first() {
            out.push_str(&format!(
                " kpx's kernel write alone {:.0} ms = {:.2}x",
                d.first.kernel_ms,
                d.first.kernel_ms / up
            ));
        }
        out.push('\n');
    }
    out
}

/// `--plugin-only`: the WASM render against the same generator native,
/// nothing else, `PLUGIN_ONLY_REPS` times each, interleaved so drift hits
/// both sides alike. Split into the state crossing in (`reset`) and the
/// render with its output crossing out, so a change to either side of
/// the boundary shows where it went. Those runs are cold (a fresh
/// instance, whose memory grows as it goes, against a native heap that
/// kept what the last run freed); the warm runs are full renders of one
/// instance and one native generator, reset once, as the daemon's full
/// resyncs of an unchanged state find them.
pub fn plugin_only(args: &Args) -> Result<()> {
    const PLUGIN_ONLY_REPS: usize = 21;
    let dir = PathBuf::from("target/bench");
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    println!(
        "mode      services x eps |  wasm: reset  render   total | native: reset  render   total | wasm/native | warm: wasm  native  wasm/native (medians of {PLUGIN_ONLY_REPS}, ms)"
    );
    for (mode, services, endpoints) in &args.sizes {
        let text = cluster::manifests(*services, *endpoints, None);
        let proxy_mode: ProxyMode = mode.parse().map_err(anyhow::Error::msg)?;
        let (_, ports) = state_of(parse(&text)?);
        let (node, settings) = node_settings(mode)?;
        let objects_count: usize = ports.iter().map(|p| 1 + p.endpoints.len()).sum();
        let runtime = Runtime::new(Limits::default(), Some(dir.join("plugin-cache")))?;
        let plugin = runtime.load_backend(mode, builtin::get(mode).context("no built-in plugin")?)?;
        let (mut wasm, mut native) = (Vec::new(), Vec::new());
        // The first WASM ruleset, checked against the first native one.
        let mut first = None;
        for _ in 0..PLUGIN_ONLY_REPS {
            let mut instance = plugin.instantiate(&settings)?;
            let t = Instant::now();
            instance.reset(&node, &Cluster::default(), &ports)?;
            let reset = t.elapsed();
            let ruleset = instance.render(true, objects_count)?;
            wasm.push((reset, t.elapsed()));
            if first.is_none() {
                first = Some(ruleset);
            }
            drop(instance);

            let mut n = Native::new(proxy_mode, settings.clone());
            let input = ports.clone();
            let t = Instant::now();
            n.backend().reset(node.clone(), Cluster::default(), input);
            let reset = t.elapsed();
            let ruleset = n.backend().render(true).map_err(anyhow::Error::msg)?;
            native.push((reset, t.elapsed()));
            if native.len() == 1 && Some(&ruleset) != first.as_ref() {
                bail!("the WASM and native renders differ");
            }
            drop((n, ruleset));
        }
        let med = |mut v: Vec<Duration>| {
            v.sort();
            v[v.len() / 2]
        };
        let split = |runs: &[(Duration, Duration)]| {
            let reset = med(runs.iter().map(|r| r.0).collect());
            let render = med(runs.iter().map(|r| r.1 - r.0).collect());
            let total = med(runs.iter().map(|r| r.1).collect());
            (reset, render, total)
        };
        let (wr, wn, wt) = split(&wasm);
        let (nr, nn, nt) = split(&native);
        // Warm: one instance and one native generator, reset once (not
        // timed); the first render of each grows its memory and is not
        // counted.
        let mut instance = plugin.instantiate(&settings)?;
        instance.reset(&node, &Cluster::default(), &ports)?;
        let mut n = Native::new(proxy_mode, settings.clone());
        n.backend().reset(node.clone(), Cluster::default(), ports.clone());
        let (mut warm_wasm, mut warm_native) = (Vec::new(), Vec::new());
        for run in 0..=PLUGIN_ONLY_REPS {
            let t = Instant::now();
            let ruleset = instance.render(true, objects_count)?;
            let wasm_time = t.elapsed();
            if first.as_ref() != Some(&ruleset) {
                bail!("a warm WASM render differs from the first");
            }
            drop(ruleset);
            let t = Instant::now();
            let ruleset = n.backend().render(true).map_err(anyhow::Error::msg)?;
            let native_time = t.elapsed();
            drop(ruleset);
            if run > 0 {
                warm_wasm.push(wasm_time);
                warm_native.push(native_time);
            }
        }
        let (ww, wnat) = (med(warm_wasm), med(warm_native));
        println!(
            "{mode:<9} {services:>6} x {endpoints:<6}| {:>11.1} {:>7.1} {:>7.1} | {:>13.1} {:>7.1} {:>7.1} | {:>10.2}x | {:>10.1} {:>7.1} {:>11.2}x",
            ms(wr),
            ms(wn),
            ms(wt),
            ms(nr),
            ms(nn),
            ms(nt),
            wt.as_secs_f64() / nt.as_secs_f64().max(1e-9),
            ms(ww),
            ms(wnat),
            ww.as_secs_f64() / wnat.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}
