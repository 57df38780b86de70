//! The 0.4.0 extension world: 0.2.0's extender, with the `accept` action
//! and `check-parameters`. Its types (settings, ports, changes, CIDRs)
//! and its log import are 0.2.0's, bound to 0.2.0's Rust types, so the
//! state crosses as it does for a 0.2.0 extension.
//! 0.4.0 restates 0.2.0's attachment, rate and source-match, converted
//! below.

use std::sync::Arc;

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
use kpx_rules::ops::extension as x;
use wasmtime::Store;
use wasmtime::component::{InstancePre, ResourceAny};

use crate::runtime::PluginState;
use crate::runtime::wit::since_v0_2_0::{self as v2, wit_convert};

wasmtime::component::bindgen!({
    path: "../wit/since_v0.4.0",
    world: "extension-plugin",
    with: {
        "kpx:proxier/types@0.2.0": crate::runtime::wit::since_v0_2_0::kpx::proxier::types,
        "kpx:proxier/log@0.2.0": crate::runtime::wit::since_v0_2_0::kpx::proxier::log,
    },
});

use self::exports::kpx::proxier0_4_0::extension as we;

/// A linked 0.4.0 extension component.
pub struct Pre(ExtensionPluginPre<PluginState>);

impl Pre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<Pre> {
        Ok(Pre(ExtensionPluginPre::new(pre)?))
    }

    /// Instantiates the component and constructs its extender with the
    /// operator's parameters.
    pub fn instantiate(
        &self,
        store: &mut Store<PluginState>,
        settings: &Settings,
        parameters: &[(String, String)],
    ) -> wasmtime::Result<Instance> {
        let bindings = self.0.instantiate(&mut *store)?;
        let resource = bindings.kpx_proxier0_4_0_extension().extender().call_constructor(
            &mut *store,
            &wit_convert::to_wit_settings(settings),
            parameters,
        )?;
        Ok(Instance { bindings: Arc::new(bindings), resource })
    }

    /// The component's answer to the operator's parameters, from an
    /// instance of its own in `store` (no extender is constructed): `Err`
    /// inside is its refusal, with its reason.
    pub fn check_parameters(
        &self,
        store: &mut Store<PluginState>,
        parameters: &[(String, String)],
    ) -> wasmtime::Result<Result<(), String>> {
        let bindings = self.0.instantiate(&mut *store)?;
        bindings.kpx_proxier0_4_0_extension().call_check_parameters(&mut *store, parameters)
    }
}

/// A live 0.4.0 extender resource. Every service port it is sent carries
/// the annotations under `prefix` only, the prefix removed.
#[derive(Clone)]
pub struct Instance {
    bindings: Arc<ExtensionPlugin>,
    resource: ResourceAny,
}

impl Instance {
    pub fn reset(
        &self,
        store: &mut Store<PluginState>,
        prefix: &str,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        let services = v2::extension_ports(services, prefix);
        let (node, cluster) = (wit_convert::to_wit_node(node), wit_convert::to_wit_cluster(cluster));
        self.bindings.kpx_proxier0_4_0_extension().extender().call_reset(
            store,
            self.resource,
            &node,
            &cluster,
            &services,
        )
    }

    pub fn apply(&self, store: &mut Store<PluginState>, prefix: &str, changes: &[Change]) -> wasmtime::Result<()> {
        let changes = v2::extension_changes(changes, prefix);
        self.bindings.kpx_proxier0_4_0_extension().extender().call_apply(store, self.resource, &changes)
    }

    /// The rules, converted; `Err` inside for the extension's own error.
    /// (An address the rule model cannot hold is kept for the host's
    /// checks to refuse with the rule in hand, as 0.2.0's.)
    pub fn render(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Result<x::Ruleset, String>> {
        let out = self.bindings.kpx_proxier0_4_0_extension().extender().call_render(store, self.resource)?;
        Ok(out.map(ruleset))
    }
}

/// An extension's rules: moves only (the checks are validate::extension's).
fn ruleset(r: we::Ruleset) -> x::Ruleset {
    x::Ruleset { rules: r.rules.into_iter().map(rule).collect() }
}

fn rule(r: we::Rule) -> x::Rule {
    x::Rule {
        attachment: attachment(r.attachment),
        service: r.service,
        source: r.source.map(|s| x::SourceMatch { negate: s.negate, cidr: wit_convert::from_wit_cidr(&s.cidr) }),
        over_rate: r.over_rate.map(|o| x::Rate { per_second: o.per_second, burst: o.burst }),
        counter: r.counter,
        action: action(r.action),
    }
}

fn attachment(a: we::Attachment) -> x::Attachment {
    match a {
        we::Attachment::BeforeDispatch => x::Attachment::BeforeDispatch,
        we::Attachment::Service => x::Attachment::Service,
        we::Attachment::Firewall => x::Attachment::Firewall,
    }
}

fn action(a: we::Action) -> x::Action {
    match a {
        we::Action::Continue => x::Action::Continue,
        we::Action::Drop => x::Action::Drop,
        we::Action::Reject => x::Action::Reject,
        we::Action::Accept => x::Action::Accept,
    }
}
