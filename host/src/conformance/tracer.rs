//! The conformance flows through the packet tracers (no root needed): each
//! case's state goes through the backend component and the host's checks,
//! as the daemon would send it; every flow is traced through what the
//! kernel would hold (iptables: the frame and the component's rules
//! rendered and read back; nftables: the frame and the component's
//! transaction).

use kpx_rules::model::{Cluster, IpFamily, Node, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::Ruleset;
use kpx_rules::trace::{self, Packet};

use super::Report;
use super::cases::{Case, Flow};
use crate::kernel::{iptables, ipvs, nftables};
use crate::runtime::{BackendPlugin, Limits, objects};
use crate::settings::{node_for_plugins, settings_for};
use crate::validate::Scope;

/// One case's rules in one family, as the daemon would program them.
pub struct Rendered {
    pub settings: Settings,
    pub cluster: Cluster,
    pub ports: Vec<ServicePort>,
    pub ruleset: Ruleset,
}

/// What a backend is sent for a case in one family.
pub struct Inputs {
    pub settings: Settings,
    pub node: Node,
    pub cluster: Cluster,
    pub ports: Vec<ServicePort>,
}

/// The case's state for a family, as the daemon would send it.
/// `params`: the backend's `--backend-param KEY=VALUE`s.
pub fn inputs(case: &Case, mode: ProxyMode, family: IpFamily, params: &[String]) -> Result<Inputs, String> {
    let mut args = vec!["--proxy-mode", mode.as_str()];
    for p in params {
        args.extend(["--backend-param", p.as_str()]);
    }
    let config = case.config(std::path::Path::new("/dev/null"), &args)?;
    let state = case.state()?;
    let node = node_for_plugins(&config, state.node(family), family);
    // The node's interfaces: its addresses and loopback.
    let mut local = case.node.addresses.clone();
    local.extend(["127.0.0.1", "::1"].map(|a| a.parse::<std::net::IpAddr>().expect("loopback")));
    let settings = settings_for(&config, family, &node, &local);
    let cluster = state.cluster(family);
    let ports = case.service_ports(&state, family);
    Ok(Inputs { settings, node, cluster, ports })
}

/// A fresh instance's full render of a case in one family.
pub fn render(
    plugin: &BackendPlugin,
    case: &Case,
    mode: ProxyMode,
    family: IpFamily,
    params: &[String],
) -> Result<Rendered, String> {
    let Inputs { settings, node, cluster, ports } = inputs(case, mode, family, params)?;
    let mut instance = plugin.instantiate(&settings).map_err(|e| e.to_string())?;
    instance.reset(&node, &cluster, &ports).map_err(|e| e.to_string())?;
    let ruleset = instance.render(true, objects(&ports)).map_err(|e| e.to_string())?;
    Ok(Rendered { settings, cluster, ports, ruleset })
}

/// The host's checks of what a component returns, with the model of what
/// earlier syncs left, as the daemon keeps them for one family.
pub struct Host {
    /// The component's name, as refusals name it.
    pub plugin: String,
    /// The family's settings the component was given.
    pub settings: Settings,
    /// What the component's rules may refer to.
    pub scope: Scope,
    /// The ports the scope counts, by key.
    ports: crate::state::PortMap,
    iptables: crate::validate::iptables::Model,
    /// What the last accepted iptables ruleset left in the host's chains.
    written: Option<iptables::Previous>,
    nftables: crate::validate::nftables::Model,
}

impl Host {
    pub fn new(plugin: &str, settings: &Settings, ports: &[ServicePort]) -> Host {
        let mut host = Host {
            plugin: plugin.to_string(),
            settings: settings.clone(),
            scope: Scope::default(),
            ports: Default::default(),
            iptables: Default::default(),
            written: None,
            nftables: Default::default(),
        };
        host.rescope(ports);
        host.scope.forget_removed();
        host
    }

    /// The service ports the state now holds (after changes): counted in
    /// and out as the daemon does, so that what left is known to the
    /// checks of the next partial render (rules kept for departed objects).
    pub fn rescope(&mut self, ports: &[ServicePort]) {
        let family = self.settings.family;
        let now = crate::state::port_map(ports);
        for (key, old) in &self.ports {
            if now.get(key) != Some(old) {
                self.scope.count(family, old, false);
            }
        }
        for (key, port) in &now {
            if self.ports.get(key) != Some(port) {
                self.scope.count(family, port, true);
            }
        }
        self.ports = now;
    }

    /// Everything a sync does before the kernel: the host's checks and the
    /// encoding within the output cap. Accepted rulesets are remembered,
    /// as after a write; the refusal is returned as the host words it.
    pub fn accept(&mut self, ruleset: &Ruleset, full: bool) -> Result<(), String> {
        let max_bytes = usize::try_from(Limits::default().max_output_bytes).unwrap_or(usize::MAX);
        let plugin = self.plugin.as_str();
        match ruleset {
            Ruleset::Iptables(rs) => {
                if full {
                    self.iptables = Default::default();
                }
                let ctx = crate::validate::iptables::Context {
                    plugin,
                    dialect: iptables::dialect(&self.settings),
                    scope: &self.scope,
                    model: &self.iptables,
                    full,
                };
                let previous = self.written.take().filter(|_| !full);
                let prepared =
                    iptables::prepare(&ctx, &self.settings, rs, max_bytes, previous).map_err(|e| e.to_string())?;
                self.iptables.commit(prepared.checked);
                self.written = Some(iptables::Previous { host_chains: prepared.host_chains, hooks: prepared.hooks });
                self.scope.forget_removed();
            }
            Ruleset::Nftables(tx) => {
                if full {
                    self.nftables = Default::default();
                }
                let ctx = crate::validate::nftables::Context {
                    plugin,
                    family: self.settings.family,
                    scope: &self.scope,
                    model: &self.nftables,
                    full,
                };
                let (checked, _) = nftables::prepare(&ctx, &self.settings, tx, max_bytes).map_err(|e| e.to_string())?;
                self.nftables.commit(checked);
                self.scope.forget_removed();
            }
            Ruleset::Ipvs(rs) => {
                ipvs::dataplane::check(plugin, &self.settings, rs, &self.scope).map_err(|e| e.to_string())?
            }
        }
        Ok(())
    }
}

/// Traces one packet through what a case's rules became.
pub type Walk = Box<dyn Fn(&Packet) -> Result<trace::Trace, String>>;

/// The tracer over a case's rendered rules; None for ipvs rules, which
/// are not traced.
pub fn walker(rendered: &Rendered, case: &Case) -> Result<Option<Walk>, String> {
    let node = trace::Node { local_addresses: case.node.addresses.clone() };
    Ok(match &rendered.ruleset {
        Ruleset::Iptables(rs) => {
            let tables = iptables::trace_tables(&rendered.settings, rs)?;
            Some(Box::new(move |p| trace::iptables::trace_iptables(&tables, &node, p).map_err(|e| e.to_string())))
        }
        Ruleset::Nftables(tx) => {
            let model = nftables::trace_model(&rendered.settings, &rendered.cluster, &rendered.ports, tx)
                .map_err(|e| e.to_string())?;
            Some(Box::new(move |p| trace::nftables::trace_nftables(&model, &node, p).map_err(|e| e.to_string())))
        }
        Ruleset::Ipvs(_) => None,
    })
}

/// The row a case's flows are counted in.
pub fn flows_row(case: &Case, how: &str) -> String {
    format!("flows ({how}): {}", case.label().trim_end_matches(".yaml"))
}

/// Every case's rules through the host's checks, and its flows through
/// the tracer: a row per case, a check per flow.
pub fn flows(report: &mut Report, plugin: &BackendPlugin, mode: ProxyMode, params: &[String]) {
    const ACCEPTED: &str = "every case's full render passes the host's checks";
    for case in Case::all() {
        let row = flows_row(&case, "tracer");
        for family in [IpFamily::V4, IpFamily::V6] {
            let flows: Vec<&Flow> = case.flows.iter().filter(|f| f.family() == family).collect();
            if flows.is_empty() {
                continue;
            }
            let label = format!("{} ({family})", case.label());
            let rendered = match render(plugin, &case, mode, family, params) {
                Ok(r) => r,
                Err(e) => {
                    report.row(ACCEPTED).fail(format!("{label}: {e}"));
                    report.row(&row).fail(format!("{family}: no rules to trace"));
                    continue;
                }
            };
            let mut host = Host::new(plugin.name(), &rendered.settings, &rendered.ports);
            let accepted = host.accept(&rendered.ruleset, true);
            report.row(ACCEPTED).record(accepted.clone().map_err(|e| format!("{label}: {e}")));
            if accepted.is_err() {
                report.row(&row).fail(format!("{family}: the host refuses the rules"));
                continue;
            }
            let walk = match walker(&rendered, &case) {
                Ok(Some(walk)) => walk,
                Ok(None) => {
                    // IPVS: each port's cluster IP has a virtual server with
                    // its endpoints (the kernel's own scheduling is not traced).
                    let ports = crate::state::port_map(&rendered.ports);
                    let required = crate::sync::coverage::required(family, &ports);
                    let outcome = crate::sync::coverage::covered(
                        &rendered.settings,
                        &rendered.cluster,
                        &case.node.addresses,
                        &ports,
                        &required,
                        &rendered.ruleset,
                    )
                    .and_then(|covered| match required.difference(&covered).next() {
                        Some(key) => {
                            Err(format!("{label}: no virtual server sends {key}'s cluster IP to its endpoints"))
                        }
                        None => Ok(()),
                    });
                    report.row("ipvs rules: every cluster IP a virtual server over its endpoints").record(outcome);
                    report.row("flows (tracer)").skip(format!(
                        "{mode} rules: the tracer walks iptables and nftables rules (ipvs flows run with --kernel, in a kernel with ip_vs)"
                    ));
                    continue;
                }
                Err(e) => {
                    report.row(&row).fail(format!("{family}: the tracer cannot read the rules: {e}"));
                    continue;
                }
            };
            for flow in flows {
                let outcome = check_flow(&case, flow, mode, &walk);
                report.row(&row).record(outcome.map_err(|e| format!("{}: {e}", flow.name)));
            }
        }
    }
}

fn check_flow(case: &Case, flow: &Flow, mode: ProxyMode, walk: &Walk) -> Result<(), String> {
    let (dst, dport) = flow.destination();
    let packet = Packet {
        src: flow.from,
        dst,
        dport,
        protocol: flow.protocol(),
        from_node: trace::Node { local_addresses: case.node.addresses.clone() }.is_local(&flow.from),
        in_interface: flow.iface.clone(),
    };
    let got = walk(&packet).map_err(|e| format!("tracer error: {e}"))?.verdict;
    let expect = flow.expected(mode.as_str());
    let masq_matters = got.endings.iter().any(|e| matches!(e, trace::Ending::Endpoint(_)));
    if got.to_string() != expect || (masq_matters && got.masquerade != flow.masquerades(mode.as_str())) {
        return Err(format!(
            "{} -> {} {}: got {got} (masquerade {}), want {expect} (masquerade {})",
            flow.from,
            flow.to,
            flow.proto,
            got.masquerade,
            flow.masquerades(mode.as_str())
        ));
    }
    Ok(())
}
