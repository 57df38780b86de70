//! The conformance suite through the packet tracers (no root needed): each
//! case's state goes through the real WASM plugin of the mode and the
//! host's confinement check; every flow is traced through what the kernel
//! would hold (iptables: the frame and the plugin's rules rendered and read
//! back; nftables: the frame and the plugin's transaction).

use kpx::kernel::{iptables, nftables};
use kpx::runtime::{Limits, Runtime, builtin};
use kpx::settings::{node_for_plugins, settings_for};
use kpx::validate::Scope;
use kpx_rules::model::{IpFamily, ProxyMode};
use kpx_rules::ops::Ruleset;
use kpx_rules::trace::{self, Packet};

use crate::cases::Case;

/// Traces one packet through what a case's rules became.
type Walk = Box<dyn Fn(&Packet) -> Result<trace::Trace, String>>;

fn run(mode: ProxyMode) {
    let cases = Case::load_all();
    let flows: usize = cases.iter().map(|c| c.flows.len()).sum();
    assert!(flows >= 60, "the suite has only {flows} flows");
    let runtime = Runtime::new(Limits::default(), Some(crate::support::plugin_cache().into())).unwrap();
    let plugin = runtime.load_backend(mode.as_str(), builtin::get(mode.as_str()).unwrap()).unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let config = case.config(std::path::Path::new("/dev/null"), &["--proxy-mode", mode.as_str()]);
        let state = case.state();
        for family in [IpFamily::V4, IpFamily::V6] {
            let flows: Vec<_> = case.flows.iter().filter(|f| f.family() == family).collect();
            if flows.is_empty() {
                continue;
            }
            let node = node_for_plugins(&config, state.node(family), family);
            let settings = settings_for(&config, family, &node, &case.node.addresses);
            let cluster = state.cluster(family);
            let ports = case.service_ports(&state, family);
            let mut instance = plugin.instantiate(&settings).unwrap();
            instance.reset(&node, &cluster, &ports).unwrap();
            let ruleset = instance.render(true, 0).unwrap();
            // What the daemon would write must pass the host's checks.
            let mut scope = Scope::default();
            for p in &ports {
                scope.count(family, p, true);
            }
            let tracer_node = trace::Node { local_addresses: case.node.addresses.clone() };
            let walk: Walk = match &ruleset {
                Ruleset::Iptables(rs) => {
                    let ctx = kpx::validate::iptables::Context {
                        plugin: "iptables",
                        dialect: iptables::dialect(&settings),
                        scope: &scope,
                        model: &Default::default(),
                        full: true,
                    };
                    kpx::validate::iptables::check(&ctx, rs).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
                    let tables =
                        iptables::trace_tables(&settings, rs).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
                    let n = tracer_node.clone();
                    Box::new(move |p| trace::iptables::trace_iptables(&tables, &n, p).map_err(|e| e.to_string()))
                }
                Ruleset::Nftables(tx) => {
                    let ctx = kpx::validate::nftables::Context {
                        plugin: "nftables",
                        family,
                        scope: &scope,
                        model: &Default::default(),
                        full: true,
                    };
                    kpx::validate::nftables::check(&ctx, tx).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
                    let model = nftables::trace_model(&settings, &cluster, tx)
                        .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
                    let n = tracer_node.clone();
                    Box::new(move |p| trace::nftables::trace_nftables(&model, &n, p).map_err(|e| e.to_string()))
                }
                Ruleset::Ipvs(_) => panic!("{}: the tracer walks iptables and nftables rules only", case.label()),
            };
            for flow in flows {
                let (dst, dport) = flow.destination();
                let packet = Packet {
                    src: flow.from,
                    dst,
                    dport,
                    protocol: flow.protocol(),
                    from_node: tracer_node.is_local(&flow.from),
                    in_interface: flow.iface.clone(),
                };
                let got = match walk(&packet) {
                    Ok(t) => t.verdict,
                    Err(e) => {
                        failures.push(format!("{} / {}: tracer error: {e}", case.label(), flow.name));
                        continue;
                    }
                };
                let expect = flow.expected(mode.as_str());
                let masq_matters = got.endings.iter().any(|e| matches!(e, trace::Ending::Endpoint(_)));
                if got.to_string() != expect || (masq_matters && got.masquerade != flow.masq) {
                    failures.push(format!(
                        "{} / {}: {} -> {} {}: got {} (masq {}), want {} (masq {})",
                        case.label(),
                        flow.name,
                        flow.from,
                        flow.to,
                        flow.proto,
                        got,
                        got.masquerade,
                        expect,
                        flow.masq
                    ));
                }
            }
        }
    }
    eprintln!("conformance (tracer, {mode}): {} cases, {flows} flows, {} failures", cases.len(), failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn iptables_mode_passes_every_case_through_the_tracer() {
    run(ProxyMode::Iptables);
}

#[test]
fn nftables_mode_passes_every_case_through_the_tracer() {
    run(ProxyMode::Nftables);
}
