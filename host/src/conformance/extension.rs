//! The kit for extension components: the contract (fresh instances agree;
//! changes applied one by one render what a reset renders; every render
//! passes the host's checks and lays out into kernel objects of both
//! modes), with every case's state and the hostile inputs, in the
//! iptables and nftables modes and both families.

use kpx_rules::model::{Change, IpFamily, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::extension::Ruleset;

use super::Report;
use super::backend::hostile_cases;
use super::cases::Case;
use super::tracer::{Inputs, inputs};
use crate::extension::{iptables, layout, nftables};
use crate::runtime::{ExtensionPlugin, objects};

/// The name the kit configures the extension under (its annotations are
/// `ext.kpx.dev/kit.*`).
pub const NAME: &str = "kit";

const SAME_RULES: &str = "contract: fresh instances render the same rules";
const ACCEPTED: &str = "contract: the host accepts the rules";
const INCREMENTAL: &str = "contract: changes applied one by one render what a reset renders";
const OBJECTS: &str = "contract: the rules lay out into kernel objects of both modes";
/// Why [`OBJECTS`] skips a state: one skip per state (case, mode, family).
const NO_RULES: &str = "the state (case, mode, family) got no rules from the extension, so there was nothing \
                        to lay out (no Service of the family, or none with the annotations the extension reads: \
                        --extension-annotation)";

/// Every check of an extension configured with `parameters`, every
/// Service of the states carrying `annotations` (keys without the
/// `ext.kpx.dev/kit.` prefix).
pub fn check(
    report: &mut Report,
    plugin: &ExtensionPlugin,
    parameters: &[(String, String)],
    annotations: &[(String, String)],
) {
    // What kpx asks first, at load: a refusal stops kpx, so the rest would
    // never run with these parameters.
    let checked = plugin.check_parameters(parameters).map_err(|e| e.to_string());
    let refused = checked.is_err();
    report.row("contract: accepts its parameters at load (check-parameters)").record(checked);
    if refused {
        return;
    }
    let prefix = crate::runtime::extension::annotation_prefix(NAME);
    // Another extension's annotation rides along: the host keeps it from this one.
    let mut annotations: Vec<(String, String)> =
        annotations.iter().map(|(k, v)| (format!("{prefix}{k}"), v.clone())).collect();
    annotations.push(("ext.kpx.dev/other.secret".into(), "not for the kit".into()));
    annotations.sort();
    let cases: Vec<(String, Case, bool)> = Case::all()
        .into_iter()
        .map(|c| (c.label().to_string(), c, false))
        .chain(hostile_cases().into_iter().map(|(what, c)| (format!("hostile input: {what}"), c, true)))
        .collect();
    for (label, case, hostile) in &cases {
        for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
            for family in [IpFamily::V4, IpFamily::V6] {
                let at = if *hostile { format!("{mode}, {family}") } else { format!("{label} ({mode}, {family})") };
                let Inputs { settings, node, cluster, mut ports } = match inputs(case, mode, family, &[]) {
                    Ok(i) => i,
                    Err(e) => {
                        report.row(ACCEPTED).fail(format!("{at}: the case: {e}"));
                        continue;
                    }
                };
                for p in &mut ports {
                    p.annotations = annotations.clone();
                }
                let render = |ports: &[ServicePort]| -> Result<Ruleset, String> {
                    let mut i = plugin.instantiate(NAME, &settings, parameters).map_err(|e| e.to_string())?;
                    i.reset(&node, &cluster, ports).map_err(|e| e.to_string())?;
                    i.render(objects(ports)).map_err(|e| e.to_string())
                };
                let (first, second) = match (render(&ports), render(&ports)) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(e), _) | (_, Err(e)) => {
                        report.row(ACCEPTED).fail(format!("{at}: {e}"));
                        continue;
                    }
                };
                let row = if *hostile { format!("{label}: the host accepts the rules") } else { ACCEPTED.into() };
                let accepted = accept(plugin, &settings, &first, &ports);
                report.row(&row).record(accepted.clone().map(|_| ()).map_err(|e| format!("{at}: {e}")));
                if let Ok(layout) = accepted {
                    match encode(&settings, &layout) {
                        Ok(Some(inert)) => {
                            report.row(OBJECTS).pass();
                            for i in inert {
                                report.row(OBJECTS).note(format!("inert rules: {i}"));
                            }
                        }
                        Ok(None) => report.row(OBJECTS).skip(NO_RULES),
                        Err(e) => report.row(OBJECTS).fail(format!("{at}: {e}")),
                    }
                }
                if *hostile {
                    continue;
                }
                report.row(SAME_RULES).record(if first == second {
                    Ok(())
                } else {
                    Err(format!("{at}: two fresh instances rendered different rules for the same state"))
                });
                report.row(INCREMENTAL).record(
                    incremental(plugin, parameters, &settings, &node, &cluster, &ports, &first)
                        .map_err(|e| format!("{at}: {e}")),
                );
            }
        }
    }
}

/// The host's check, then the layout.
fn accept(
    plugin: &ExtensionPlugin,
    settings: &Settings,
    rules: &Ruleset,
    ports: &[ServicePort],
) -> Result<layout::Layout, String> {
    let by_key = crate::state::port_map(ports);
    let skipped =
        crate::validate::extension::check(plugin.name(), settings.family, rules, &by_key).map_err(|e| e.to_string())?;
    if let Some((port, why)) = skipped.iter().next() {
        return Err(format!("the rules for {port} are left out: {why}"));
    }
    Ok(layout::build(NAME, settings, rules, &by_key, &skipped))
}

/// Both modes' writes of a layout: each port chain's rules written in
/// both, and reached from an entry for each of its destinations. A chain
/// whose port has no destination at its attachment (a `firewall` rule of
/// a port without load-balancer IPs) is inert: noted. None: no rules.
fn encode(settings: &Settings, layout: &layout::Layout) -> Result<Option<Vec<String>>, String> {
    if layout.chains.is_empty() {
        return Ok(None);
    }
    let (text, _) = iptables::payload(NAME, layout, &Default::default());
    let (batch, _) = nftables::messages(&nftables::table_name(NAME), settings.family, layout, None);
    let prefix = iptables::prefix(NAME);
    let mut inert = Vec::new();
    let mut entries_total = 0;
    for (id, chain) in &layout.chains {
        let name = format!("{prefix}{id}");
        let written =
            text.lines().filter(|l| l.starts_with(&format!("-A {name} ")) || *l == format!("-A {name}")).count();
        if written != chain.rules.len() {
            return Err(format!(
                "{} rules of {} laid out, {written} written for iptables",
                chain.rules.len(),
                chain.service
            ));
        }
        let entries = layout.entries.get(&chain.attachment).into_iter().flatten().filter(|e| &e.chain == id).count();
        let reached = text.lines().filter(|l| l.ends_with(&format!(" -g {name}"))).count();
        if reached < entries {
            return Err(format!(
                "{entries} destinations of {} lead to its chain, {reached} iptables entries",
                chain.service
            ));
        }
        if entries == 0 {
            inert.push(format!("{}: no destination at {}", chain.service, chain.attachment.name()));
        }
        entries_total += entries;
    }
    let rules: usize = layout.chains.values().map(|c| c.rules.len()).sum();
    if batch.len() < 1 + rules + entries_total {
        return Err(format!("{rules} rules and {entries_total} entries laid out, {} nftables messages", batch.len()));
    }
    Ok(Some(inert))
}

/// From an empty state, each port added with `apply`; then the first
/// removed: each time the rules must be a reset's.
fn incremental(
    plugin: &ExtensionPlugin,
    parameters: &[(String, String)],
    settings: &Settings,
    node: &kpx_rules::model::Node,
    cluster: &kpx_rules::model::Cluster,
    ports: &[ServicePort],
    expected: &Ruleset,
) -> Result<(), String> {
    let fail = |e: crate::runtime::Error| e.to_string();
    let mut instance = plugin.instantiate(NAME, settings, parameters).map_err(fail)?;
    instance.reset(node, cluster, &[]).map_err(fail)?;
    for port in ports {
        instance.apply(&[Change::Upsert(port.clone())]).map_err(fail)?;
    }
    if &instance.render(objects(ports)).map_err(fail)? != expected {
        return Err(format!("{} ports added one by one render other rules than a reset", ports.len()));
    }
    let Some(first) = ports.first() else { return Ok(()) };
    instance.apply(&[Change::Remove(first.key.clone())]).map_err(fail)?;
    let rest = &ports[1..];
    let after = instance.render(objects(rest)).map_err(fail)?;
    let mut fresh = plugin.instantiate(NAME, settings, parameters).map_err(fail)?;
    fresh.reset(node, cluster, rest).map_err(fail)?;
    if after != fresh.render(objects(rest)).map_err(fail)? {
        return Err(format!("after removing {}, other rules than a reset renders", first.key));
    }
    let by_key = crate::state::port_map(rest);
    crate::validate::extension::check(plugin.name(), settings.family, &after, &by_key)
        .map(|_| ())
        .map_err(|e| format!("after removing {}: {e}", first.key))
}
