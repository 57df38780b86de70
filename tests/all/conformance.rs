//! The conformance suite through the packet tracers (no root needed): each
//! case's state goes through the real WASM plugin of the mode, and every
//! flow is traced through the rules it renders.

use kpx::runtime::{Limits, Runtime, builtin};
use kpx::settings::{node_for_plugins, settings_for};
use kpx_rules::iptables::jumps_for;
use kpx_rules::model::IpFamily;
use kpx_rules::trace::{self, Packet, nftables::NftModel, parse_ruleset, trace_iptables};

use crate::cases::Case;

fn run(mode: &str) {
    let cases = Case::load_all();
    let flows: usize = cases.iter().map(|c| c.flows.len()).sum();
    assert!(flows >= 60, "the suite has only {flows} flows");
    let runtime = Runtime::new(Limits::default(), Some(crate::support::plugin_cache().into())).unwrap();
    let plugin = runtime.load_backend(mode, builtin::get(mode).unwrap()).unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let config = case.config(std::path::Path::new("/dev/null"), &["--proxy-mode", mode]);
        let state = case.state();
        for family in [IpFamily::V4, IpFamily::V6] {
            let flows: Vec<_> = case.flows.iter().filter(|f| f.family() == family).collect();
            if flows.is_empty() {
                continue;
            }
            let node = node_for_plugins(&config, state.node(family), family);
            let settings = settings_for(&config, family, &node, &case.node.addresses);
            let mut instance = plugin.instantiate(&settings).unwrap();
            instance.reset(&node, &state.cluster(family), &case.service_ports(&state, family)).unwrap();
            let text = instance.render(true, 0).unwrap().text().to_string();
            let tracer_node = trace::Node { local_addresses: case.node.addresses.clone() };
            let mut model = NftModel::default();
            let iptables = if mode == "iptables" {
                Some(parse_ruleset(&text).unwrap_or_else(|e| panic!("{}: {e}", case.label())))
            } else {
                model.apply(&text).unwrap_or_else(|e| panic!("{}: {e}", case.label()));
                None
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
                let traced = match &iptables {
                    Some(rules) => trace_iptables(rules, &jumps_for(&settings), &tracer_node, &packet),
                    None => trace::nftables::trace_nftables(&model, &tracer_node, &packet),
                };
                let got = match traced {
                    Ok(t) => t.verdict,
                    Err(e) => {
                        failures.push(format!("{} / {}: tracer error: {e}", case.label(), flow.name));
                        continue;
                    }
                };
                let expect = flow.expected(mode);
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
    run("iptables");
}

#[test]
fn nftables_mode_passes_every_case_through_the_tracer() {
    run("nftables");
}
